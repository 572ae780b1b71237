"""DeepSpeed's ZeRO-3 as it ran in spring 2021 (`Workload.zero3_impl = "deepspeed-2021"`): a weight at a
time, one module ahead, the host in step with the device.

What the source does (microsoft/DeepSpeed v0.3.13, 12a53b43, 2021-03-16, the release of the month Narayanan
et al. 2021 ran ZeRO-3 in; deepspeed/runtime/zero/stage3.py and partition_parameters.py):

- Every module's pre-forward (and pre-backward) hook fetches that module's own weights, each with its own
  `torch.distributed.all_gather` (`_allgather_param`) into a list of world-size views of a fresh flat tensor
  (`torch.zeros`), and waits for them (`_synchronize_communication`: the handles, the fetch stream and
  `torch.cuda.synchronize()`). A weight under `stage3_param_persistence_threshold` (1e5 elements: norms,
  biases) is gathered once and kept.
- It then prefetches the next module's weights (`prefetch_next_sub_modules`): from the trace, weights until
  `stage3_prefetch_bucket_size` (5e7) elements, so one whole weight of any large model, and only while the
  gathered weights total under `stage3_max_live_parameters` (1e9). The prefetch runs beside this module's
  kernels; nothing further ahead.
- The host never runs ahead of the device: each `_allgather_param` calls `torch.cuda.synchronize()` before
  its all_gather (DeepSpeed's own later fix says so: "the async version is not async at all, because each
  all_gather calls torch.cuda.synchronize()", commit c0eeb69d, #1188, October 2021), and the post-forward
  release sets `param.data = torch.ones(1).half().to(device)`, a blocking host-to-device copy. So what the host
  does between modules, the device waits for.
- PyTorch's list all_gather flattens: ProcessGroupNCCL::allgather gathers into one buffer and copies it out to
  each of the world-size output views, one `copy_` per rank (torch/lib/c10d/ProcessGroupNCCL.cpp at 00f5dfd5,
  PyTorch 1.8-1.9; `_all_gather_base` without the copies came after). DeepSpeed builds those views in a Python
  loop over the ranks. So each gather costs the host one small op per rank, and the device three passes over
  the weight (the zeroed flat tensor, the copy out of NCCL's buffer: read and write).
- Gradients: with stage 3's default `contiguous_gradients = False` (zero/config.py), a full bucket
  (`reduce_bucket_size` 5e8 elements; a larger weight alone) goes to `buffered_reduce_fallback`: flattened,
  divided by the world size and **all-reduced in fp16** (`allreduce_bucket`), then copied back into each
  gradient: six passes over it, and the all-reduce's 2(n-1)/n of it on the wire, where FSDP reduce-scatters
  fp32. With `overlap_comm` (stage 3's default) it runs on its own stream, but the next bucket waits for it
  (`reduce_ipg_grads`: `reduction_stream.synchronize()`), so it runs beside the next module's backward.
  ProcessGroupNCCL has one NCCL stream per device, so the gathers and the reductions queue on it one after
  another.
- Full recompute: the recompute's forward hooks gather the layer again; its backward keeps a weight from the
  recompute only when the weights used in between total under `stage3_max_reuse_distance` (1e9 elements):
  in a GPT layer, only the last module's.

So per module: the host's issue of its collectives, then the longer of the module's kernels and the wire
time of the collectives beside them (the prefetched next weight, the previous gradient bucket); a weight not
prefetched is gathered while the device waits. Nothing here is fitted; the defaults are DeepSpeed's
(zero/constants.py at v0.3.13).
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.planner import collectives as coll

MAX_LIVE_PARAMETERS = 1e9
"""stage3_max_live_parameters (zero/constants.py at v0.3.13): no prefetch while this many gathered elements
are held."""
MAX_REUSE_DISTANCE = 1e9
"""stage3_max_reuse_distance: a released weight stays gathered if it is used again within this many elements."""
PERSISTENCE_THRESHOLD = 1e5
"""stage3_param_persistence_threshold: smaller weights are gathered once and kept (stage3.persistent_parameters)."""
GATHER_COPY_PASSES = 2
"""Device passes over a gathered weight after NCCL's: ProcessGroupNCCL's copy out of its flattened output into
the per-rank views, a read and a write (the flat tensor's torch.zeros before it is a third, on its own)."""
REDUCE_HBM_PASSES = 6
"""Device passes over a reduced gradient bucket: flatten (read, write), div_ by the world size (read, write),
the copy back into each gradient (read, write): stage3.allreduce_bucket and allreduce_and_copy."""
GRAD_BYTES = 2
"""fp16 gradients on the wire: allreduce_bucket reduces the flattened fp16 bucket (allreduce_always_fp32 off)."""


@dataclass(frozen=True)
class Zero3Layer:
    """One layer and one micro-batch under DeepSpeed-2021 ZeRO-3, seconds."""

    fwd: float
    """Added to the forward beyond the layer's kernels."""
    bwd: float
    """Added to the recompute and the backward beyond their kernels."""
    traffic: float
    """Every collective's wire time and the host's issue of them, hidden or not."""


def module_weights(cfg, layer_params: float) -> tuple[float, ...]:
    """A layer's weights on one rank, in call order, one per module as Megatron's GPT holds them (fused QKV,
    the output projection, the MLP's first matrix with SwiGLU's gate and up fused, its second), scaled to the
    layer's own parameter count on this rank (so MLA or expert layers keep their size)."""
    h, e = cfg.dim, cfg.head_size
    qkv = h * e * (cfg.n_heads + 2 * cfg.n_kv_heads)
    out = cfg.n_heads * e * h
    mlp_in = (2 if cfg.mlp == "swiglu" else 1) * h * cfg.ffn_hidden
    mlp_out = h * cfg.ffn_hidden
    shapes = (qkv, out, mlp_in, mlp_out)
    scale = layer_params / sum(shapes)
    return tuple(w * scale for w in shapes)


def layer_cost(weights: tuple[float, ...], fwd: float, recompute: float, bwd: float, core: tuple[float, float],
               n: int, per_node: int, net: coll.Network, gpu, elem: int) -> Zero3Layer:
    """The schedule above for one layer: `fwd`, `recompute`, `bwd` are its kernels (seconds) and `core` the
    attention core's forward and backward among them, `weights` its modules' parameters on this rank
    (module_weights), n the data-parallel ranks, `elem` the 16-bit width. The GEMMs and element-wise work go
    to the modules by their weights; the attention core has no weights, so it runs between the QKV and the
    output projection's hooks: beside the output projection's prefetch in forward, the QKV's in backward."""
    stream = gpu.hbm_bandwidth * gpu.hbm_efficiency
    gathered = [w if w >= PERSISTENCE_THRESHOLD else 0.0 for w in weights]
    host = n * gpu.host_op_cost  # one small op per rank: DeepSpeed's view, or PyTorch's copy out to it

    def zeroed(w: float) -> float:
        """torch.zeros of the flat tensor, then torch.cuda.synchronize(): the device does it alone."""
        return w * elem / stream

    def gather(w: float) -> float:
        """The wire, then ProcessGroupNCCL's copies out (queued behind it on the NCCL stream)."""
        return coll.all_gather(w * elem, n, per_node, net) + GATHER_COPY_PASSES * w * elem / stream

    def reduce(w: float) -> float:
        return coll.all_reduce(w * GRAD_BYTES, n, per_node, net) + REDUCE_HBM_PASSES * w * GRAD_BYTES / stream

    share = [w / sum(weights) for w in weights]
    hide = gpu.overlap_cost

    def slots(kernels: float, attention: float, after: int) -> list[float]:
        """The kernels between one module's hook and the next's, by module: `attention` after module `after`."""
        out = [(kernels - attention) * s for s in share]
        out[after] += attention
        return out

    def run(kernels: list[float], order: list[int], held: set[int], reducing: bool) -> tuple[float, float]:
        """(time added beyond the kernels, traffic) for one pass over the modules in `order`. The NCCL kernel
        starts as soon as it is issued, so the host's per-rank issue runs beside its wire time."""
        added = traffic = 0.0
        live, ready = 0.0, set(held)
        for j, i in enumerate(order):
            if gathered[i] and i not in ready:  # not prefetched: gathered while the device waits
                added += zeroed(gathered[i]) + max(host, gather(gathered[i]))
                traffic += zeroed(gathered[i]) + max(host, gather(gathered[i]))
                ready.add(i)
            live += gathered[i]
            beside, issue = 0.0, 0.0
            nxt = order[j + 1] if j + 1 < len(order) else None
            if nxt is not None and gathered[nxt] and nxt not in ready and live < MAX_LIVE_PARAMETERS:
                # the prefetch: zeroed, then issued before this module's kernels are
                issue = host
                added += zeroed(gathered[nxt])
                beside += gather(gathered[nxt])
                ready.add(nxt)
                live += gathered[nxt]
            if reducing:
                beside += reduce(weights[i])
            traffic += beside
            added += issue + coll.overlap(max(0.0, beside - issue), kernels[i], hide)
            live -= gathered[i]
        return added, traffic

    forward = list(range(len(weights)))
    f_added, f_traffic = run(slots(fwd, core[0], 0), forward, set(), False)
    r_added = r_traffic = 0.0
    held: set[int] = set()
    if recompute:
        r_added, r_traffic = run(slots(recompute, min(core[0], recompute), 0), forward, set(), False)
        # kept from the recompute when the weights used before its backward (the rest of the recompute, then
        # the backward of the modules after it) total under the reuse distance
        held = {i for i in forward if 2 * sum(weights[i + 1:]) < MAX_REUSE_DISTANCE}
    b_added, b_traffic = run(slots(bwd, core[1], 1), forward[::-1], held, True)
    return Zero3Layer(fwd=f_added, bwd=r_added + b_added, traffic=f_traffic + r_traffic + b_traffic)


def buffer_elements(weights: tuple[float, ...]) -> float:
    """Gathered weights and 16-bit gradients alive at once, in elements, at the busiest backward module: its
    weight and the next one's prefetch in flight, which PyTorch's list all_gather holds twice until its copies
    out (DeepSpeed's flat tensor and NCCL's flattened output); its own full gradient; the bucket before it
    being all-reduced, twice too (the gradient and its flattened copy). One module's prefetch at most, and
    none while the gathered weights reach stage3_max_live_parameters: for a 530B GPT layer 6.7e9 elements,
    where FSDP2 holds two whole layers and one layer's fp32 gradients."""
    gathered = [w if w >= PERSISTENCE_THRESHOLD else 0.0 for w in weights]
    order = list(range(len(weights)))[::-1]
    peak = 0.0
    for j, i in enumerate(order):
        nxt = gathered[order[j + 1]] if j + 1 < len(order) else 0.0
        prev = weights[order[j - 1]] if j else 0.0
        prefetch = 2 * nxt if gathered[i] < MAX_LIVE_PARAMETERS else 0.0
        # gathering this weight (twice, the gradient not yet made), or computing with it beside the prefetch
        peak = max(peak, max(2 * gathered[i], gathered[i] + prefetch + weights[i]) + 2 * prev)
    return peak

