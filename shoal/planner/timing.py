"""Step time for a layout, with a breakdown that sums to the step.

One micro-batch on the busiest pipeline rank (its layers plus the output head) takes t_f forward
and t_b backward: kernels (compute.py), recomputation, and the collectives on the critical path.
The pipeline then takes (m + (p-1)/v)·(t_f + t_b): m micro-batches plus the bubble, a
(p-1)/(v·m) fraction (1F1B and GPipe have v = 1; every schedule's bubble is in pipeline.py). After
the last backward come the data-parallel gradient reduction (the part not hidden behind that
backward) and the optimizer step.

Overlap, and why:
- tensor-parallel collectives are on the critical path (each matmul needs its result): not hidden.
- pipeline send/recv: on the critical path, once per chunk boundary each way, except in DualPipe's
  overlapped forward-backward pairs (pipeline.py), which hide them and the expert all-to-all.
- expert all-to-all: a token goes once to each rank holding one of its experts, crossing the network once
  per node (DeepEP), or once per
  expert where the stack permutes before the exchange (Megatron's alltoall dispatcher, shoal's own:
  Workload.moe_dispatch), and, where the expert group leaves
  the node (inside one the recipes do not overlap it; Workload.ep_overlap, _ep_comm), the dispatch and combine of
  one micro-batch run beside another micro-batch's attention and expert kernels (DeepSeek-V3's DualPipe,
  §3.2.1; Megatron-Core's --overlap-moe-expert-parallel-comm): only what is longer than that compute
  shows. A fully recomputed layer reruns its experts on the tokens it already holds, not the exchange.
- context-parallel K/V exchange: a ring step's send hides behind that step's attention kernel, PyTorch's
  all-gather behind the first of its attention calls, shoal's gathers not at all (context_parallel.py).
- offloading: PCIe copies per layer hide behind the layer's kernels; the host optimizer step does not.
- DDP / ZeRO-1 gradient reduction starts as soon as the last micro-batch's gradients for a bucket
  exist, so it hides behind that backward, all but the last bucket; the ZeRO-1/2 parameter
  all-gather after the optimizer hides behind the next step's first forward.
- ZeRO-2 reduce-scatters and ZeRO-3 gathers are per layer and per micro-batch; each hides behind
  the layer it is prefetched for, and only what is longer than that layer's compute shows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from shoal.planner import collectives as coll
from shoal.planner import context_parallel, pipeline, torus
from shoal.planner.compute import head_time, layer_time
from shoal.layout import Layout
from shoal.planner.workload import Cluster, Workload, expert_grid, group_ranks_per_node, layers_per_rank, moe_layer_count
from shoal.hardware.gpu import GPU
from shoal.hardware.local import is_local
from shoal.planner.memory import rank_params, stage_params, stage_unsharded
from shoal.planner.data_parallel import GRAD_REDUCE_BYTES, DataParallel, overlap

RANK_SPEED_SIGMA = 0.01
"""Spread (standard deviation, as a fraction) of the sustained speed of nominally identical GPUs. A
synchronous step waits for the slowest of N ranks, and the expected maximum of N normal samples is
about sigma * sqrt(2 ln N) above the mean. Approximate, not fitted: Sinha et al., "Not All GPUs Are
Created Equal" (SC'22) measured GEMM throughput spreads of several percent (worst ~22%) across the
A100/V100 GPUs of production clusters, from power and thermal limits. 1% is the low end of that
reading: at 1.5% the measured 512-GPU iteration of Korthikanti's Table 5 (1T, full recompute) is
predicted 12% slow, outside its 10% tolerance, so the spread is bounded by that measurement."""

OPTIMIZER_BYTES_PER_PARAM = 30
"""Adam step, memory-bound: fp32 master, momentum and variance read and written (24), the gradient
read for the step and for the clip norm (4), the 16-bit weight written (2)."""

ADAMW_OPS_PER_TENSOR = 8
"""Ops torch.optim.AdamW(foreach=False) runs per parameter tensor (torch/optim/adam.py,
_single_tensor_adam): the decoupled decay mul_, lerp_, mul_ and addcmul_ for the moments, sqrt, div,
add_ for the denominator, addcdiv_. (Its step counter's += 1 is a plain scalar.)"""

CLIP_OPS_PER_TENSOR = 2
"""Gradient clipping with foreach=False (train/optim.clip_grad_norm): one norm and one scale per gradient."""


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step; the fields up to `optimizer` add up to `step`."""

    compute: float
    """Forward and backward kernels (GEMMs, attention, memory-bound ops) of all micro-batches."""
    recompute: float
    """Forward kernels re-run under activation checkpointing."""
    tp_comm: float
    """Tensor/sequence-parallel all-reduces, all-gathers and reduce-scatters."""
    pp_comm: float
    """Pipeline sends and receives between stages."""
    ep_comm: float
    """Expert-parallel all-to-all (dispatch and combine), the part not hidden behind other kernels."""
    fsdp_comm: float
    """Exposed per-micro-batch ZeRO-2 reduce-scatters and ZeRO-3 parameter gathers."""
    bubble: float
    """Pipeline fill and drain: (p-1)/v micro-batch times."""
    dp_comm: float
    """Exposed data-parallel gradient reduction and parameter gather once per step."""
    optimizer: float
    """The optimizer step on this GPU's shard."""
    tail: float
    """Waiting for the slowest rank: the expected maximum over the job's GPUs of their speed spread."""
    cp_comm: float
    """Context-parallel K/V exchange not hidden behind attention."""
    offload: float
    """Host<->GPU copies not hidden behind kernels, and the optimizer step on the host."""
    step: float
    microbatches: int
    dp_comm_total: float
    """Gradient reduction and parameter gather per step before overlap (to show how much is hidden)."""
    tp_on_nvlink: bool
    """Whether every TP group sits inside one node."""

    @property
    def bubble_fraction(self) -> float:
        return self.bubble / self.step if self.step else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "bubble_fraction": self.bubble_fraction}


def network(cluster: Cluster) -> coll.Network:
    gpu = cluster.gpu
    shape = torus.slice_shape(min(cluster.n_gpus, cluster.gpus_per_node), gpu.torus_dims) if gpu.torus_dims else ()
    return coll.Network(gpu.intra_busbw, gpu.intra_node_latency, gpu.inter_busbw, gpu.inter_node_latency,
                        gpu.nodes_per_leaf, gpu.oversubscription, slice_shape=shape,
                        wraparound=torus.has_wraparound(shape, gpu.torus_wrap_side))


def step_time(workload: Workload, layout: Layout, cluster: Cluster) -> StepTime:
    """The step on the busiest rank, its parts in the module docstring's order: one micro-batch's
    forward and backward (kernels and the collectives on their critical path), the pipeline with its
    bubble, then what comes once per step (gradient reduction, parameter gather, the optimizer) and
    the wait for the slowest rank."""
    return _step(workload, layout, cluster, data_parallel=True)


def step_floor(workload: Workload, layout: Layout, cluster: Cluster) -> float:
    """step_time().step less its data-parallel parts (ZeRO-2/3 per-layer traffic, the gradient reduction and
    parameter gather, the optimizer step), each >= 0: a floor under it that is the same for every ZeRO stage.
    The search orders layouts by it and times only those that can still rank."""
    return _step(workload, layout, cluster, data_parallel=False).step


def _step(workload: Workload, layout: Layout, cluster: Cluster, data_parallel: bool) -> StepTime:
    k = _Kernels(workload, layout, cluster)
    tp_fwd, tp_bwd = _tp_comm(k)
    ep_fwd, ep_bwd = _ep_comm(k)
    cp_fwd, cp_bwd = context_parallel.exchange_time(k)
    off_fwd, off_bwd = _offload_per_layer(k)
    # save_on_cpu wraps the loss too: its fp32 log-probabilities [T, V/tp] go out and come back (Transformer
    # Engine's offload context wraps the layers only).
    off_head = (k.T * k.cfg.vocab_size / k.lay.tp * 4 / k.gpu.host_bandwidth
                if k.lay.activation_offload and not k.workload.offload_overlap else 0.0)
    dp = DataParallel(k) if data_parallel else None
    fsdp_fwd, fsdp_bwd, fsdp_start = dp.per_layer(k.fwd + tp_fwd, k.bwd + k.recompute + tp_bwd) if dp else (0.0,) * 3

    # --- one micro-batch on the busiest rank, then the pipeline (its bubble per schedule: pipeline.py) ---
    lay, m, layers, head = layout, k.m, k.layers, k.head_share
    p2p_f, p2p_b = _p2p(k)
    t_f = layers * (k.fwd + tp_fwd + ep_fwd + cp_fwd + off_fwd + fsdp_fwd) + head * (k.head.fwd + off_head) + p2p_f
    t_b = layers * (k.bwd + k.recompute + tp_bwd + ep_bwd + cp_bwd + off_bwd + fsdp_bwd) + head * (k.head.bwd + off_head) + p2p_b \
        + k.accumulate
    # W: the weight-gradient GEMMs of backward, as many FLOPs as the forward's (compute.py)
    bubble = pipeline.bubble(lay.pp_schedule, lay.pp, lay.virtual_stages, t_f, t_b,
                             layers * k.gemm_fwd + head * k.head.gemm_fwd)

    # --- once per step ---
    dp_total, dp_exposed = dp.per_step(t_f, t_b, k.fwd + tp_fwd, k.bwd + k.recompute + tp_bwd) if dp else (0.0, 0.0)
    optimizer, host_step = _optimizer_time(k, dp, m * t_b) if dp else (0.0, 0.0)
    # The slowest GPU's kernels set the pace: its spread stretches kernel time, not the wire time.
    kernels = m * (layers * (k.fwd + k.bwd + k.recompute) + head * k.head.fwd + head * k.head.bwd + k.accumulate)
    n = cluster.n_gpus
    tail = kernels * RANK_SPEED_SIGMA * math.sqrt(2 * math.log(n)) if n > 1 else 0.0
    step = m * (t_f + t_b) + bubble + fsdp_start + dp_exposed + optimizer + tail + host_step
    return StepTime(
        compute=m * (layers * (k.fwd + k.bwd) + head * k.head.fwd + head * k.head.bwd + k.accumulate),
        recompute=m * layers * k.recompute,
        tp_comm=m * layers * (tp_fwd + tp_bwd),
        pp_comm=m * (p2p_f + p2p_b),
        ep_comm=m * layers * (ep_fwd + ep_bwd),
        fsdp_comm=m * layers * (fsdp_fwd + fsdp_bwd) + fsdp_start,
        bubble=bubble,
        dp_comm=dp_exposed,
        optimizer=optimizer,
        tail=tail,
        cp_comm=m * layers * (cp_fwd + cp_bwd),
        offload=m * (layers * (off_fwd + off_bwd) + 2 * head * off_head) + host_step,
        step=step,
        microbatches=m,
        dp_comm_total=dp_total,
        tp_on_nvlink=k.g_tp == lay.tp,
    )


class _Kernels:
    """The shape of the step and the kernels of one average layer and of the output head, for one
    micro-batch on this rank (compute.py), which every other term builds on."""

    def __init__(self, workload: Workload, layout: Layout, cluster: Cluster):
        cfg, lay, gpu = workload.model, layout, cluster.gpu
        self.workload, self.lay, self.cfg, self.gpu, self.cluster = workload, layout, cfg, gpu, cluster
        self.net, self.G = network(cluster), cluster.gpus_per_node
        self.prec, self.elem = workload.precision, (4 if workload.precision == "fp32" else 2)
        self.gathered = workload.gathered_weight_bytes
        self.m = lay.microbatches(workload.global_batch)
        self.T = workload.seq_len * lay.micro_batch / lay.cp  # tokens of one micro-batch on this rank
        n_moe = moe_layer_count(cfg)
        self.n_moe, self.moe_share = n_moe, n_moe / cfg.n_layers
        self.layers = min(cfg.n_layers, layers_per_rank(cfg.n_layers, lay.pp, lay.virtual_stages))
        args = (cfg, gpu, workload.seq_len, lay.micro_batch, lay.tp, lay.sequence_parallel, workload.attention,
                self.prec)
        mask = workload.document_mask
        # `kernels` matters for MoE layers only
        cp = dict(cp_comm=workload.cp_comm, cp_compiled=workload.kernels == "fused")
        dense = layer_time(*args, False, lay.ep, lay.cp, "fused", mask, **cp) if n_moe < cfg.n_layers else None
        moe = (layer_time(*args, True, lay.ep, lay.cp, workload.kernels, mask, **cp, expert_tp=lay.expert_tp)
               if n_moe else None)
        self.moe_kernels = moe

        def avg(field: str) -> float:
            d = getattr(dense, field) if dense else 0.0
            e = getattr(moe, field) if moe else 0.0
            return (1 - self.moe_share) * d + self.moe_share * e

        self.fwd, self.bwd, self.attn_fwd, self.gemm_fwd = avg("fwd"), avg("bwd"), avg("attn_fwd"), avg("gemm_fwd")
        self.recompute = {"none": 0.0, "selective": avg("selective_fwd"), "selective-op": avg("op_fwd"),
                          "full": avg("full_fwd")}[lay.activation_checkpoint]
        self.head = head_time(cfg, gpu, workload.seq_len, lay.micro_batch, lay.tp, self.prec, lay.cp)
        self.dualpipe = lay.pp_schedule == "dualpipe" and lay.pp > 1
        # The micro-batches whose output head the busiest rank runs: all on the last stage, half under DualPipe
        self.head_share = pipeline.DUALPIPE_HEAD_SHARE if self.dualpipe else 1.0
        # The share of chunks that run in an overlapped DualPipe F&B pair (none otherwise)
        self.paired = pipeline.dualpipe_paired_share(lay.pp, self.m) if self.dualpipe else 0.0
        self.act = self.T * cfg.dim * self.elem  # one full-sequence activation tensor
        self.accumulate = _accumulation_pass(self) if workload.grad_accumulation == "separate" else 0.0
        self.g_tp = group_ranks_per_node(lay.tp, lay.rank_stride("tp"), self.G)


def _accumulation_pass(k: _Kernels) -> float:
    """Workload.grad_accumulation `separate`, per micro-batch: a kernel adds each new weight gradient into the
    accumulated one, reading the new gradient and reading and writing the sum (3 gradient-sized tensors, 16-bit
    but under fp32) for every parameter on this GPU. The first micro-batch's gradient is taken as it is
    (autograd's AccumulateGrad), so a step runs m - 1 of them, spread here over its m backwards. FSDP2 (zero 2/3)
    accumulates in its fp32 reduce dtype: each micro-batch's reduce-scattered shard into the sharded sum, or,
    under a pipeline, the whole stage's gradients unsharded (memory.stage_unsharded)."""
    if k.m == 1:
        return 0.0
    lay = k.lay
    expert_tp, expert_dp = expert_grid(lay)
    params = stage_params(k.cfg, lay, "last", expert_tp)
    dense, expert, elem = params.dense, params.expert, k.elem
    if lay.zero >= 2 and not k.gpu.xla_step:
        elem = 4
        if not stage_unsharded(lay, False):
            dense, expert = dense / (lay.dp_shard * lay.cp), expert / expert_dp
    passes = (k.m - 1) / k.m
    return passes * 3 * elem * (dense + expert) / (k.gpu.hbm_bandwidth * k.gpu.hbm_efficiency)


def _tp_comm(k: _Kernels) -> tuple[float, float]:
    """Tensor parallelism, per layer, forward and backward: on the critical path."""
    lay, gpu = k.lay, k.gpu
    # DTensor's own cost per collective; only the sequence-sharded layout copies the buffer around it
    redistribute = gpu.tp_redistribute_latency + k.act * gpu.tp_redistribute_per_byte
    net = k.net.for_group(lay.tp, lay.rank_stride("tp"))
    if lay.tp > 1 and lay.sequence_parallel:
        # 2 all-gathers (in front of QKV and the first MLP GEMM; in backward the output gradients in front of
        # the row-parallel GEMMs' dgrad) + 2 reduce-scatters (the row-parallel outputs; in backward the dgrads)
        gathered = k.act * (0.5 if k.prec == "fp8" and k.workload.fp8_gather != "none" else 1.0)  # Workload.fp8_gather
        tp_fwd = 2 * (coll.all_gather(gathered, lay.tp, k.g_tp, net) + coll.all_gather(k.act, lay.tp, k.g_tp, net)
                      + 2 * redistribute)
    elif lay.tp > 1:
        tp_fwd = 2 * (coll.all_reduce(k.act, lay.tp, k.g_tp, net) + gpu.tp_redistribute_latency)
    else:
        tp_fwd = 0.0
    tp_bwd = tp_fwd + (tp_fwd if lay.activation_checkpoint == "full" else 0.0)
    if gpu.tp_overlap:  # collective matmul: each collective beside the matmul it feeds (catalog.tp_overlap)
        return overlap(tp_fwd, k.gemm_fwd, gpu.overlap_cost), overlap(tp_bwd, 2 * k.gemm_fwd, gpu.overlap_cost)
    return tp_fwd, tp_bwd


def _ep_comm(k: _Kernels) -> tuple[float, float]:
    """Expert all-to-all, dispatch and combine, averaged over the layers (MoE layers only): what shows
    beyond the kernels of another micro-batch's layer it runs beside (module docstring).

    Workload.ep_overlap says where it hides: `on` wherever another micro-batch is in flight, `off` nowhere (DualPipe's
    pairs aside), `auto` only where the expert group leaves the node. Overlapping it is opt-in (Megatron-Core's
    --overlap-moe-expert-parallel-comm, off by default and needing --delay-wgrad-compute; DeepSeek-V3's
    DualPipe), and no published recipe turns it on for an exchange inside an 8-GPU node: Megatron-Bridge's
    performance presets (scripts/performance/configs/{qwen/qwen3,deepseek/deepseek}_workload_base_configs.py)
    set moe_a2a_overlap=False for Qwen3-235B and DeepSeek-V3 at EP 8 in a B200 node, and True for Qwen3-235B
    on H100 at EP 32 and DeepSeek-V3 FP8-MX on B200 at EP 32 (four nodes); DeepSeek-V3 itself (EP 64 over
    InfiniBand) overlaps with DualPipe. Across nodes the overlap is the optimistic side: the same presets
    leave it off for DeepSeek-V3 on H100 at EP 64."""
    lay, cfg = k.lay, k.cfg
    if not (k.n_moe and lay.ep > 1):
        return 0.0, 0.0
    etp = expert_grid(lay)[0]
    folded = etp != lay.tp  # the expert group spans tp ranks too: neighbours, past each expert's etp ranks
    stride = etp if folded else lay.rank_stride("dp")
    g_ep, net = group_ranks_per_node(lay.ep, stride, k.G), k.net.for_group(lay.ep, stride)
    if k.workload.moe_dispatch == "per-expert":  # a copy per chosen expert, not in FP8 (Workload.moe_dispatch)
        tokens = k.T * cfg.top_k * cfg.dim / lay.tp
        a2a = 2 * coll.all_to_all(tokens * k.elem, lay.ep, g_ep, net)
    else:  # once a rank, crossing the network once a node; DeepSeek-V3 dispatches in FP8 and combines in BF16 (§3.3.2)
        ranks, nodes = experts_reach(cfg, lay.ep), experts_reach(cfg, max(1, lay.ep // g_ep))
        tokens = k.T * cfg.dim / lay.tp
        a2a = sum(coll.all_to_all_via_nodes(tokens * elem, ranks, nodes, lay.ep, g_ep, net)
                  for elem in (1 if k.prec == "fp8" and k.workload.moe_dispatch == "dedup" else k.elem, k.elem))
    moe = k.moe_kernels
    # Forward and backward each exchange twice (dispatch, combine); together they run beside one forward
    # and one backward of the MoE layer of another micro-batch.
    beside = overlap(2 * a2a, moe.fwd + moe.bwd, k.gpu.overlap_cost) / 2
    overlapped = {"on": True, "off": False}.get(k.workload.ep_overlap, g_ep < lay.ep)  # auto: across nodes only
    ordinary = beside if overlapped and k.m >= 2 else a2a  # with one micro-batch nothing else is in flight
    if k.dualpipe:
        # DualPipe's F&B pair hides each chunk's dispatch and combine behind the other chunk's kernels inside a
        # node too: the schedule overlaps them, not a recipe switch (DeepSeek-V3 §3.2.1, Figure 4). The chunks
        # outside the pairs (pipeline.dualpipe_paired_share) are charged as every other schedule's are.
        exposed = k.paired * beside + (1 - k.paired) * ordinary
        return k.moe_share * exposed, k.moe_share * exposed
    return k.moe_share * ordinary, k.moe_share * ordinary


def experts_reach(cfg, bins: int) -> float:
    """How many of `bins` equal shares of the routed experts, in order (the ep ranks, or their nodes), a token's
    experts fall on (ranks_per_token). Under group-limited routing (ModelConfig.expert_groups) it picks them
    among the experts of expert_groups_per_token groups only, so they fall on those groups' bins: DeepSeek-V3's
    4 of 8 groups, a node's experts each at EP 64, reach 3.63 nodes a token where uniform routing reaches 5.29
    (its §3.2.2 bounds them at 4)."""
    groups, chosen = cfg.expert_groups, cfg.expert_groups_per_token
    if not groups or not 0 < chosen < groups or bins <= 1:
        return ranks_per_token(cfg.n_experts, cfg.top_k, bins)
    pool = cfg.n_experts * chosen / groups  # the experts a token may go to
    # the bins those groups lie on: a group spans bins/groups of them, or shares one with the others
    reach = bins * chosen / groups if groups <= bins else ranks_per_token(groups, chosen, bins)
    return ranks_per_token(pool, cfg.top_k, reach)


def ranks_per_token(n_experts: float, top_k: int, ep: float) -> float:
    """Expected number of the ep ranks (n_experts/ep experts each) a token's top_k experts fall on, routing
    taken as uniform: ep·(1 - C(E - E/ep, k) / C(E, k)). A token goes once to each (deduplicated
    dispatch); e.g. 256 experts top-8 on 64 ranks: 7.68 copies, not 8; on their 8 nodes: 5.29."""
    if ep <= 1:
        return 1.0
    local = n_experts / ep
    none_here = 1.0
    for i in range(int(min(top_k, n_experts))):
        none_here *= max(0.0, (n_experts - local - i) / (n_experts - i))
    return ep * (1 - none_here)


def _offload_per_layer(k: _Kernels) -> tuple[float, float]:
    """Host copies per layer and micro-batch: offloaded parameters come in for forward and backward and
    their gradients go out, beside the layer's kernels (FSDP2 copies on its all-gather and reduce-scatter
    streams); offloaded activations go out after forward and come back for backward in full, beside the
    neighbouring layer's kernels (Workload.offload_overlap) or on the compute stream: save_on_cpu copies each
    saved tensor where it is saved, so the next kernel waits (an H200 here: 1.39 s a step where the kernels take
    ~0.2 s, docs/debugging.md)."""
    lay = k.lay
    if lay.offload != "params" and not lay.activation_offload:
        return 0.0, 0.0
    from shoal.planner.memory import activation_bytes_per_layer, memory

    pcie, hide = k.gpu.host_bandwidth, k.gpu.overlap_cost
    fwd = bwd = 0.0
    if lay.offload == "params":
        layer = rank_params(k.cfg, lay.tp, lay.ep, lay.pp, lay.virtual_stages, "last", expert_grid(lay)[0]).layer
        fwd += overlap(layer * k.elem / pcie, k.fwd, hide)
        bwd += overlap((layer * k.elem + layer * GRAD_REDUCE_BYTES) / pcie, k.bwd, hide)
    if lay.activation_offload:
        act = activation_bytes_per_layer(k.workload, lay, xla=bool(k.gpu.xla_step)) / pcie
        if k.workload.offload_overlap:  # beside the next layer's forward, the reload beside the one after's backward
            # and only for the layers that go out (Transformer Engine's count: MemoryBreakdown.offloaded_share)
            share = memory(k.workload, lay, k.cluster).offloaded_share
            fwd, bwd = fwd + share * overlap(act, k.fwd, hide), bwd + share * overlap(act, k.bwd, hide)
        else:
            fwd, bwd = fwd + act, bwd + act
    return fwd, bwd


def _p2p(k: _Kernels) -> tuple[float, float]:
    """Pipeline transfers on the busiest rank's critical path per micro-batch, (forward, backward): its
    activation out and its gradient back at each chunk boundary, or DeepSpeed's blocking exchange
    (Workload.pp_p2p, _blocking_p2p)."""
    lay = k.lay
    if lay.pp == 1:
        return 0.0, 0.0
    same_node = lay.rank_stride("pp") < k.G
    # Only 1/tp of the activation crosses: sequence parallelism leaves it split, and without it
    # Megatron's scatter/gather sends a 1/tp slice and all-gathers it over NVLink (Narayanan §4.1).
    one = coll.p2p(k.act / lay.tp, same_node, k.net)
    send = lay.virtual_stages * one
    if k.workload.pp_p2p == "blocking":
        per_microbatch = lay.virtual_stages * _blocking_p2p(k, same_node)
        return per_microbatch / 2, per_microbatch / 2
    if k.dualpipe:  # a DualPipe pair's sends run beside its kernels too (DeepSeek-V3 §3.2.1)
        send = k.paired * overlap(send, k.layers * k.fwd, k.gpu.overlap_cost) + (1 - k.paired) * send
    elif k.workload.pp_overlap and lay.pp_schedule == "interleaved-1f1b" and lay.virtual_stages > 1:
        # Megatron's overlap_p2p_comm (Workload.pp_overlap): each chunk's send and receive run beside the chunk
        # computed meanwhile, its layers' forward, and show only beyond it
        chunk = k.layers / lay.virtual_stages * k.fwd
        send = lay.virtual_stages * overlap(one, chunk, k.gpu.overlap_cost)
    return send, send


def _blocking_p2p(k: _Kernels, same_node: bool) -> float:
    """DeepSpeed's PipelineEngine (Workload.pp_p2p `blocking`, engine.py and p2p.py at 30965ea7): what one
    micro-batch's exchanges add to the pace of the pipeline. Each transfer is a blocking p2p.send/recv of the
    partition's metadata (PartitionedTensor.to_meta: ndims, the shape, the part count, the rank and the
    tp + 1 offsets, int64) and then of the 1/tp slice, cut with narrow().clone(). Each received tensor is put
    back whole: zeros, the TP all-gather, and a clone (PartitionedTensor.full). A middle stage runs four
    transfers and three re-assemblies one after another; the last stage, which also runs the output head,
    only receives the activation and sends its gradient (TrainSchedule has no next stage for it). Steps
    meet their neighbours' (each send waits for its receive), so the slower of the two sets the pace."""
    lay, elem_time = k.lay, 1 / (k.gpu.hbm_bandwidth * k.gpu.hbm_efficiency)
    meta = 8 * (1 + 3 + 2 + lay.tp + 1)  # [s, b, h] activation
    transfer = coll.p2p(meta, same_node, k.net) + coll.p2p(k.act / lay.tp, same_node, k.net) \
        + 2 * k.act / lay.tp * elem_time  # the slice's clone before it is sent
    gather = 0.0
    if lay.tp > 1:  # PipelineEngine partitions only when there is model parallelism (is_pipe_partitioned)
        gather = coll.all_gather(k.act, lay.tp, k.g_tp, k.net.for_group(lay.tp, lay.rank_stride("tp"))) \
            + 3 * k.act * elem_time  # zeros written, then the clone read and written
    last_stage = 2 * transfer + gather
    middle_stage = 4 * transfer + 3 * gather
    head = k.head_share * (k.head.fwd + k.head.bwd)
    return max(last_stage, middle_stage - head)


HOST_MEMORY_BANDWIDTH_PER_GPU = 60e9
"""Host DRAM bandwidth one GPU's offloaded optimizer step gets, bytes/s. DGX H100: two Xeon 8480C, each
8 channels of DDR5-4800 at 38.4 GB/s (JEDEC), 614 GB/s in all; STREAM reaches about 80% of it; shared by
8 GPUs: ~60 GB/s. Derived, approximate; CPU Adam is memory-bound (ZeRO-Offload, Ren et al. 2021, §5)."""


def _optimizer_time(k: _Kernels, dp: DataParallel, backward: float) -> tuple[float, float]:
    """(GPU optimizer step, host-side step) on this rank's shard. On the GPU: memory-bound, plus per-tensor
    dispatch on CPU ranks. Offloaded (ZeRO-Offload): the gradients go to the host over PCIe beside the
    backward, the update runs there at host memory speed, the 16-bit weights come back; not hidden."""
    lay, params = k.lay, dp.params
    shard = dp.n
    local = params.dense / (shard if lay.zero >= 1 else 1) + params.expert / (dp.edp if lay.zero >= 1 else 1)
    if lay.offload != "none":
        pcie, hide = k.gpu.host_bandwidth, k.gpu.overlap_cost
        grads_out = overlap(local * k.elem / pcie, backward, hide)
        return 0.0, grads_out + OPTIMIZER_BYTES_PER_PARAM * local / HOST_MEMORY_BANDWIDTH_PER_GPU + local * k.elem / pcie
    optimizer = OPTIMIZER_BYTES_PER_PARAM * local / (k.gpu.hbm_bandwidth * k.gpu.hbm_efficiency)
    if is_local(k.gpu):
        optimizer += _unfused_update_dispatch(lay, params.tensors, k.gpu)
    return optimizer, 0.0


def _unfused_update_dispatch(lay: Layout, tensors: float, gpu: GPU) -> float:
    """Host time of an optimizer step that updates one tensor at a time: on CPU ranks shoal runs AdamW
    and the clip with foreach=False (train/optim.adamw_kernel), ~10 ops per parameter tensor, each paying
    the per-op dispatch. GPUs run fused AdamW (a few launches for all tensors), left out. The parameters
    are DTensors, each op paying DTensor's host work too, under tensor parallelism and wherever FSDP2
    holds them (ZeRO-2/3, or replicate() for a model split another way); ZeRO-1 updates 1/dp of them."""
    dtensors = lay.tp > 1 or (lay.dp > 1 and not lay.replicates_with_ddp)
    per_op = gpu.kernel_gap + (gpu.tp_kernel_overhead if dtensors else 0.0)
    updated = tensors / lay.dp_shard if lay.zero == 1 and lay.dp_shard > 1 else tensors
    return (ADAMW_OPS_PER_TENSOR * updated + CLIP_OPS_PER_TENSOR * tensors) * per_op
