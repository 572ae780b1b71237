"""Step time for a layout, with a breakdown that sums to the step.

One micro-batch on the busiest pipeline rank (its layers plus the output head) takes t_f forward
and t_b backward: kernels (compute.py), recomputation, and the collectives on the critical path.
The pipeline then takes (m + (p-1)/v)·(t_f + t_b): m micro-batches plus the bubble, a
(p-1)/(v·m) fraction (1F1B and GPipe have v = 1). After the last backward come the data-parallel
gradient reduction (the part not hidden behind that backward) and the optimizer step.

Overlap, and why:
- tensor-parallel collectives are on the critical path (each matmul needs its result): not hidden.
- pipeline send/recv: on the critical path, once per chunk boundary each way.
- expert all-to-all: on the critical path (the experts wait for their tokens).
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
from shoal.planner.compute import head_time, layer_time
from shoal.layout import Layout
from shoal.planner.workload import Cluster, Workload, group_ranks_per_node, layers_per_rank, moe_layer_count
from shoal.hardware.catalog import GPU
from shoal.hardware.local import is_local
from shoal.planner.memory import rank_params
from shoal.planner.slow_links import QUANTIZED, grad_wire_factor

GRAD_REDUCE_BYTES = 4
"""Gradients are reduced in fp32 under bf16 mixed precision: shoal's FSDP2 policy (reduce_dtype=float32,
parallel/data_parallel.py), torchtitan's default, Composer's DEFAULT policy and Megatron's
--accumulate-allreduce-grads-in-fp32. So reduce-scatters and all-reduces of gradients move 4 bytes per
parameter while parameter all-gathers move 2."""

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
    """Expert-parallel all-to-all (dispatch and combine)."""
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
    return coll.Network(gpu.intra_busbw, gpu.intra_node_latency, gpu.inter_busbw, gpu.inter_node_latency,
                        gpu.nodes_per_leaf, gpu.oversubscription)


def step_time(workload: Workload, layout: Layout, cluster: Cluster) -> StepTime:
    """The step on the busiest rank, its parts in the module docstring's order: one micro-batch's
    forward and backward (kernels and the collectives on their critical path), the pipeline with its
    bubble, then what comes once per step (gradient reduction, parameter gather, the optimizer) and
    the wait for the slowest rank."""
    k = _Kernels(workload, layout, cluster)
    tp_fwd, tp_bwd = _tp_comm(k)
    ep_fwd, ep_bwd = _ep_comm(k)
    dp = _DataParallel(k)
    fsdp_fwd, fsdp_bwd, fsdp_start = dp.per_layer(k.fwd + tp_fwd, k.bwd + k.recompute + tp_bwd)

    # --- one micro-batch on the busiest rank, then the pipeline ---
    lay, m, layers = layout, k.m, k.layers
    p2p = _p2p(k)
    t_f = layers * (k.fwd + tp_fwd + ep_fwd + fsdp_fwd) + k.head.fwd + p2p
    t_b = layers * (k.bwd + k.recompute + tp_bwd + ep_bwd + fsdp_bwd) + k.head.bwd + p2p
    bubble_mbs = 0.0 if lay.pp == 1 else (lay.pp - 1) / lay.virtual_stages
    if lay.pp_schedule == "zero-bubble":
        # Splitting backward into input and weight gradients lets weight-gradient work fill the
        # idle slots: ZB-H1 (same memory as 1F1B) leaves about a third of 1F1B's bubble
        # (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, Table 3 / Fig. 4).
        bubble_mbs /= 3
    bubble = bubble_mbs * (t_f + t_b)

    # --- once per step ---
    dp_total, dp_exposed = dp.per_step(t_f, t_b, k.bwd + k.recompute + tp_bwd)
    optimizer = _optimizer_time(k, dp)
    # The slowest GPU's kernels set the pace: its spread stretches kernel time, not the wire time.
    kernels = m * (layers * (k.fwd + k.bwd + k.recompute) + k.head.fwd + k.head.bwd)
    n = cluster.n_gpus
    tail = kernels * RANK_SPEED_SIGMA * math.sqrt(2 * math.log(n)) if n > 1 else 0.0
    step = m * (t_f + t_b) + bubble + fsdp_start + dp_exposed + optimizer + tail
    return StepTime(
        compute=m * (layers * (k.fwd + k.bwd) + k.head.fwd + k.head.bwd),
        recompute=m * layers * k.recompute,
        tp_comm=m * layers * (tp_fwd + tp_bwd),
        pp_comm=m * 2 * p2p,
        ep_comm=m * layers * (ep_fwd + ep_bwd),
        fsdp_comm=m * layers * (fsdp_fwd + fsdp_bwd) + fsdp_start,
        bubble=bubble,
        dp_comm=dp_exposed,
        optimizer=optimizer,
        tail=tail,
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
        self.workload, self.lay, self.cfg, self.gpu = workload, layout, cfg, gpu
        self.net, self.G = network(cluster), cluster.gpus_per_node
        self.prec, self.elem = workload.precision, (4 if workload.precision == "fp32" else 2)
        self.m = lay.microbatches(workload.global_batch)
        self.T = workload.seq_len * lay.micro_batch
        n_moe = moe_layer_count(cfg)
        self.n_moe, self.moe_share = n_moe, n_moe / cfg.n_layers
        self.layers = min(cfg.n_layers, layers_per_rank(cfg.n_layers, lay.pp, lay.virtual_stages))
        args = (cfg, gpu, workload.seq_len, lay.micro_batch, lay.tp, lay.sequence_parallel, workload.attention,
                self.prec)
        dense = layer_time(*args, False, lay.ep) if n_moe < cfg.n_layers else None
        moe = layer_time(*args, True, lay.ep) if n_moe else None

        def avg(field: str) -> float:
            d = getattr(dense, field) if dense else 0.0
            e = getattr(moe, field) if moe else 0.0
            return (1 - self.moe_share) * d + self.moe_share * e

        self.fwd, self.bwd = avg("fwd"), avg("bwd")
        self.recompute = {"none": 0.0, "selective": avg("selective_fwd"), "selective-op": avg("op_fwd"),
                          "full": self.fwd}[lay.activation_checkpoint]
        self.head = head_time(cfg, gpu, workload.seq_len, lay.micro_batch, lay.tp, self.prec)
        self.act = self.T * cfg.dim * self.elem  # one full-sequence activation tensor
        self.g_tp = group_ranks_per_node(lay.tp, lay.rank_stride("tp"), self.G)


def _tp_comm(k: _Kernels) -> tuple[float, float]:
    """Tensor parallelism, per layer, forward and backward: on the critical path."""
    lay, gpu = k.lay, k.gpu
    # DTensor's own cost per collective; only the sequence-sharded layout copies the buffer around it
    redistribute = gpu.tp_redistribute_latency + k.act * gpu.tp_redistribute_per_byte
    if lay.tp > 1 and lay.sequence_parallel:
        tp_fwd = 4 * (coll.all_gather(k.act, lay.tp, k.g_tp, k.net) + redistribute)  # 2 all-gathers + 2 reduce-scatters
    elif lay.tp > 1:
        tp_fwd = 2 * (coll.all_reduce(k.act, lay.tp, k.g_tp, k.net) + gpu.tp_redistribute_latency)
    else:
        tp_fwd = 0.0
    return tp_fwd, tp_fwd + (tp_fwd if lay.activation_checkpoint == "full" else 0.0)


def _ep_comm(k: _Kernels) -> tuple[float, float]:
    """Expert all-to-all, dispatch and combine, averaged over the layers (MoE layers only)."""
    lay = k.lay
    if not (k.n_moe and lay.ep > 1):
        return 0.0, 0.0
    g_ep = group_ranks_per_node(lay.ep, lay.rank_stride("dp"), k.G)
    a2a = coll.all_to_all(k.T * k.cfg.top_k * k.cfg.dim * k.elem / lay.tp, lay.ep, g_ep, k.net)
    ep_fwd = k.moe_share * 2 * a2a
    return ep_fwd, ep_fwd + (ep_fwd if lay.activation_checkpoint == "full" else 0.0)


def _p2p(k: _Kernels) -> float:
    """Pipeline send (or receive) of one micro-batch's activation per chunk boundary."""
    lay = k.lay
    if lay.pp == 1:
        return 0.0
    same_node = lay.rank_stride("pp") < k.G
    # Only 1/tp of the activation crosses: sequence parallelism leaves it split, and without it
    # Megatron's scatter/gather sends a 1/tp slice and all-gathers it over NVLink (Narayanan §4.1).
    return lay.virtual_stages * coll.p2p(k.act / lay.tp, same_node, k.net)


class _DataParallel:
    """Data-parallel traffic: per layer (ZeRO-2 reduce-scatters, ZeRO-3 gathers) and once per step
    (DDP / ZeRO-1 reduction, ZeRO-1/2 parameter gather, DiLoCo's outer all-reduce)."""

    def __init__(self, k: _Kernels):
        lay, cfg, w = k.lay, k.cfg, k.workload
        self.k = k
        self.params = rank_params(cfg, lay.tp, lay.ep, lay.pp, lay.virtual_stages, "last")
        self.edp = max(1, lay.dp // lay.ep)
        self.g_dp = group_ranks_per_node(lay.dp, lay.rank_stride("dp"), k.G)
        self.g_edp = group_ranks_per_node(self.edp, lay.rank_stride("dp") * lay.ep, k.G)
        self.grad = (k.elem if k.prec == "fp32" else GRAD_REDUCE_BYTES) * grad_wire_factor(
            w.grad_compression, lay.dp, cfg, w.topk_density, w.powersgd_rank)

    def gather(self, n_dense: float, n_expert: float, nbytes: int | None = None) -> float:
        """All-gather (or reduce-scatter: same time) of these many unsharded parameters."""
        k, lay = self.k, self.k.lay
        nbytes = k.elem if nbytes is None else nbytes
        return (coll.all_gather(n_dense * nbytes, lay.dp, self.g_dp, k.net)
                + coll.all_gather(n_expert * nbytes, self.edp, self.g_edp, k.net)) if lay.dp > 1 else 0.0

    def per_layer(self, fwd: float, bwd: float) -> tuple[float, float, float]:
        """(exposed per layer forward, backward, once per step): ZeRO-2/3 collectives hide behind the
        layer they are prefetched for; the very first gather and the very last reduce-scatter show."""
        lay, hide = self.k.lay, self.k.gpu.overlap_cost
        if not (lay.dp > 1 and lay.zero >= 2):
            return 0.0, 0.0, 0.0
        # Sizes are the full (unsharded) layer on this TP rank.
        rs = self.gather(self.params.layer_dense, self.params.layer_expert, self.grad)
        ag = self.gather(self.params.layer_dense, self.params.layer_expert) if lay.zero == 3 else 0.0
        return _overlap(ag, fwd, hide), _overlap(ag + rs, bwd, hide), ag + rs

    def per_step(self, t_f: float, t_b: float, layer_bwd: float) -> tuple[float, float]:
        """(total, exposed) seconds of the once-per-step data-parallel traffic."""
        k, lay, w, params, hide = self.k, self.k.lay, self.k.workload, self.params, self.k.gpu.overlap_cost
        layer_dense, layer_expert, m, layers = params.layer_dense, params.layer_expert, k.m, k.layers
        if lay.dp > 1 and w.diloco_inner_steps:
            # DiLoCo: no gradient traffic across ranks; the parameters' all-reduce every H steps, waited for
            # at once, or with overlap running beside that many steps' kernels (int8's and fp4's all-to-all is not)
            outer = 4 * QUANTIZED[w.diloco_quantize]
            sync = (coll.all_reduce(params.dense * outer, lay.dp, self.g_dp, k.net)
                    + coll.all_reduce(params.expert * outer, self.edp, self.g_edp, k.net))
            quantized = w.diloco_quantize in ("int8", "fp4")
            beside = 0.0 if quantized else w.diloco_overlap_steps * m * (t_f + t_b)
            return sync / w.diloco_inner_steps, _overlap(sync, beside, hide) / w.diloco_inner_steps
        if lay.dp > 1 and lay.zero <= 2:
            if lay.zero == 0:
                sync = (coll.all_reduce(params.dense * self.grad, lay.dp, self.g_dp, k.net)
                        + coll.all_reduce(params.expert * self.grad, self.edp, self.g_edp, k.net))
                regather = 0.0
            else:
                regather = self.gather(params.dense, params.expert)  # updated weights back to every rank
                # ZeRO-2 reduced its gradients per micro-batch
                sync = self.gather(params.dense, params.expert, self.grad) if lay.zero == 1 else 0.0
            last_bucket = sync / max(layers, 1)
            v = lay.virtual_stages
            total = sync + regather + (m * layers * self.gather(layer_dense, layer_expert, self.grad)
                                       if lay.zero == 2 else 0.0)
            if v == 1:
                # The last micro-batch's backward, all but its last layer, hides the reduction.
                exposed = last_bucket + _overlap(sync - last_bucket, max(0.0, t_b - layer_bwd), hide)
            else:
                # Interleaved: a chunk's gradients are final only after the last micro-batch's backward through
                # that chunk. The chunk that finishes last (1/v of the rank's parameters) has only its own
                # backward, t_b/v, to hide behind; the others overlap the rest of the cool-down.
                chunk = sync / v
                exposed = (last_bucket + _overlap(chunk - last_bucket, max(0.0, t_b / v - layer_bwd), hide)
                           + _overlap(sync - chunk, t_b * (v - 1) / v, hide))
            return total, exposed + _overlap(regather, t_f, hide)
        if lay.dp > 1:
            return m * layers * (2 * self.gather(layer_dense, layer_expert)
                                 + self.gather(layer_dense, layer_expert, self.grad)), 0.0
        return 0.0, 0.0


def _optimizer_time(k: _Kernels, dp: _DataParallel) -> float:
    """The optimizer step on this rank's shard: memory-bound, plus per-tensor dispatch on CPU ranks."""
    lay, params = k.lay, dp.params
    local = params.dense / (lay.dp if lay.zero >= 1 else 1) + params.expert / (dp.edp if lay.zero >= 1 else 1)
    optimizer = OPTIMIZER_BYTES_PER_PARAM * local / (k.gpu.hbm_bandwidth * k.gpu.hbm_efficiency)
    if is_local(k.gpu):
        optimizer += _unfused_update_dispatch(lay, params.tensors, k.gpu)
    return optimizer


def _overlap(comm: float, compute: float, cost: float) -> float:
    """Time a collective adds when it runs beside `compute` seconds of kernels; `cost` is the share of
    the hidden part still paid (the device's overlap_cost)."""
    hidden = min(comm, compute)
    return (comm - hidden) + cost * hidden


def _unfused_update_dispatch(lay: Layout, tensors: float, gpu: GPU) -> float:
    """Host time of an optimizer step that updates one tensor at a time: on CPU ranks shoal runs AdamW
    and the clip with foreach=False (train/optim.adamw_kernel), ~10 ops per parameter tensor, each paying
    the per-op dispatch. GPUs run fused AdamW (a few launches for all tensors), left out. The parameters
    are DTensors, each op paying DTensor's host work too, under tensor parallelism and wherever FSDP2
    holds them (ZeRO-2/3, or replicate() for a model split another way); ZeRO-1 updates 1/dp of them."""
    dtensors = lay.tp > 1 or (lay.dp > 1 and not lay.replicates_with_ddp)
    per_op = gpu.kernel_gap + (gpu.tp_kernel_overhead if dtensors else 0.0)
    updated = tensors / lay.dp if lay.zero == 1 and lay.dp > 1 else tensors
    return (ADAMW_OPS_PER_TENSOR * updated + CLIP_OPS_PER_TENSOR * tensors) * per_op
