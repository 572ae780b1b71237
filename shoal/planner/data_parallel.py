"""Data-parallel traffic in the step: the per-layer ZeRO-2 reduce-scatters and ZeRO-3 gathers, and the
once-per-step gradient reduction, parameter gather and DiLoCo outer all-reduce, with what of each hides
behind the kernels (timing.py composes the step; its module docstring says what overlaps and why)."""

from __future__ import annotations

import math

from shoal.planner import collectives as coll
from shoal.planner import deepspeed_zero3, pipeline
from shoal.planner.collectives import overlap
from shoal.planner.memory import DDP_BUCKET_BYTES, stage_params, stage_unsharded
from shoal.planner.slow_links import QUANTIZED, grad_wire_factor
from shoal.planner.workload import expert_grid, group_ranks_per_node

GRAD_REDUCE_BYTES = 4
"""Gradients are reduced in fp32 under bf16 mixed precision: shoal's FSDP2 policy (reduce_dtype=float32,
parallel/data_parallel.py), torchtitan's default, Composer's DEFAULT policy and Megatron's
--accumulate-allreduce-grads-in-fp32. So reduce-scatters and all-reduces of gradients move 4 bytes per
parameter while parameter all-gathers move 2. A stack that reduces in bf16 says so (Workload.grad_reduce)."""


def grad_reduce_bytes(workload) -> int:
    """Bytes per gradient element on the wire under 16-bit mixed precision (Workload.grad_reduce)."""
    sixteen = workload.grad_reduce == "bf16" or (workload.grad_reduce == "auto" and workload.precision == "fp16")
    return 2 if sixteen else GRAD_REDUCE_BYTES


def weight_gather_bytes(workload, elem: int) -> int:
    """Bytes per weight a ZeRO all-gather moves: the compute dtype's, or one byte where the stack keeps its
    weights in FP8 and gathers them so (Workload.fp8_gather `all`; MXFP8's one scale per 32 left out)."""
    return 1 if workload.precision == "fp8" and workload.fp8_gather == "all" else elem


def ring_overlap_cost(gpu, net: coll.Network, n: int, g: int) -> float:
    """Share of a data-parallel ring's duration still paid while it runs beside kernels (the device's
    ring_overlap_cost, measured over NVLink), scaled by how fast the ring drives the GPU: NCCL opens
    channels, each a thread block streaming through HBM, in proportion to the bus bandwidth its links allow
    (tuning.cc: busBw = nChannels x the per-channel bandwidth), so a ring the network holds to a fraction of
    NVLink's bus bandwidth takes that fraction of the SMs and memory traffic from the kernels beside it.
    An XLA device keeps its overlap_cost; a device where nothing overlaps (cost 1: the `local` CPU) pays all."""
    if gpu.xla_step or gpu.ring_overlap_cost >= 1.0:
        return gpu.overlap_cost if gpu.xla_step else gpu.ring_overlap_cost
    k = max(1, n // g)
    return gpu.ring_overlap_cost * min(1.0, coll.ring_busbw(g, k, net) / net.intra_busbw)




class DataParallel:
    """Data-parallel traffic: per layer (ZeRO-2 reduce-scatters, ZeRO-3 gathers) and once per step
    (DDP / ZeRO-1 reduction, ZeRO-1/2 parameter gather, DiLoCo's outer all-reduce)."""

    def __init__(self, k):  # timing._Kernels: the step's shape and one layer's kernels
        lay, cfg, w = k.lay, k.cfg, k.workload
        self.k = k
        etp, self.edp = expert_grid(lay)
        self.params = stage_params(cfg, lay, "last", etp)
        # Gradients are reduced over the data-parallel ranks and the context-parallel ones (which hold the same
        # weights): torchtitan's dp_shard_cp mesh, Megatron's data-parallel-with-context-parallel group; under
        # DualPipe over both pipeline ranks that hold the stage too (pipeline.DUALPIPE_STAGE_COPIES).
        copies = pipeline.stage_copies(lay.pp_schedule) if lay.pp > 1 else 1
        self.whole_stage = stage_unsharded(lay, bool(k.gpu.xla_step))
        # HSDP (Layout.hsdp_replicas): gathers and reduce-scatters stay inside a replica group
        # (Layout.zero_group), and each reduced shard is then all-reduced across the groups (FSDP2's HSDP:
        # reduce-scatter over the shard mesh dimension, all-reduce over the replicate one, in post-backward).
        self.replicas = lay.hsdp_replicas
        self.n = lay.zero_group * copies
        self.edp = max(1, self.edp // self.replicas) * copies
        inner = lay.rank_stride("cp") if lay.cp > 1 else lay.rank_stride("dp")
        edp_stride = inner * lay.ep if etp == lay.tp else lay.ep
        self.g_dp, self.g_edp = group_ranks_per_node(self.n, inner, k.G), group_ranks_per_node(self.edp, edp_stride, k.G)
        self.net, self.net_edp = k.net.for_group(self.n, inner), k.net.for_group(self.edp, edp_stride)
        across = lay.rank_stride("dp") * lay.dp_shard  # dp_replicate sits outside dp_shard (rank_dims)
        self.g_rep = group_ranks_per_node(self.replicas, across, k.G)
        self.net_rep = k.net.for_group(self.replicas, across)
        # An XLA device reduces them in the compute dtype, before the cast back to fp32 (catalog.GPU.xla_step)
        self.weight = weight_gather_bytes(w, k.gathered)
        self.grad = (k.elem if k.prec == "fp32" or k.gpu.xla_step else grad_reduce_bytes(w)) * grad_wire_factor(
            w.grad_compression, lay.dp, cfg, w.topk_density, w.powersgd_rank)
        # Once-per-step reductions go in buckets, each its own collective paying its latency: plain DDP's
        # 25 MiB; sharded optimizers (ZeRO-1/2) as Megatron-Core's distributed optimizer buckets them, max(40M,
        # 1M x dp) parameters (distributed_data_parallel.py: larger with dp "to ensure collectives do not become
        # latency-bound").
        ddp = lay.replicates_with_ddp and lay.zero == 0
        self.bucket_bytes = DDP_BUCKET_BYTES if ddp else max(40e6, 1e6 * self.n) * grad_reduce_bytes(w)
        self.buckets = self.bucket_count(self.params.dense * self.grad)
        self.hide = self.hidden_cost()

    def hidden_cost(self) -> float:
        """What a hidden data-parallel collective still costs: each group's ring takes its own share of the GPU
        (ring_overlap_cost) for as long as it runs, so the dense group's and the expert group's shares are
        weighted by their time on the wire. Experts sharded over a group strided across nodes ring at the
        network's rate and take a smaller share than the dense group inside a node."""
        k = self.k
        if self.n <= 1:
            return k.gpu.overlap_cost
        dense = ring_overlap_cost(k.gpu, self.net, self.n, self.g_dp)
        if not self.params.expert or self.edp <= 1:
            return dense
        t_dense, t_expert = self.gather(self.params.dense, 0.0), self.gather(0.0, self.params.expert)
        expert = ring_overlap_cost(k.gpu, self.net_edp, self.edp, self.g_edp)
        return (dense * t_dense + expert * t_expert) / (t_dense + t_expert)

    @property
    def deepspeed_2021(self) -> bool:
        return self.k.lay.zero == 3 and self.k.workload.zero3_impl == "deepspeed-2021"

    def deepspeed_layer(self, fwd: float, bwd: float) -> deepspeed_zero3.Zero3Layer:
        """One layer under DeepSpeed-2021 ZeRO-3; `bwd` holds the recompute, which gathers again."""
        k = self.k
        weights = deepspeed_zero3.module_weights(k.cfg, self.params.layer)
        # compute.layer_time: fwd = gemm + attention + the rest, bwd = 2 gemm + attention's backward + 2x the rest
        core = (k.attn_fwd, max(0.0, k.bwd - 2 * (k.fwd - k.attn_fwd)))
        return deepspeed_zero3.layer_cost(weights, fwd, k.recompute, bwd - k.recompute, core, self.n, self.g_dp,
                                          self.net, k.gpu, k.elem)

    def bucket_count(self, nbytes: float) -> int:
        return max(1, math.ceil(nbytes / self.bucket_bytes))

    def gather(self, n_dense: float, n_expert: float, nbytes: int | None = None, buckets: int = 1) -> float:
        """All-gather (or reduce-scatter: same time) of these many unsharded parameters, in `buckets` calls."""
        nbytes = self.weight if nbytes is None else nbytes
        if self.n == 1:
            return 0.0
        return buckets * (coll.all_gather(n_dense * nbytes / buckets, self.n, self.g_dp, self.net)
                          + coll.all_gather(n_expert * nbytes / buckets, self.edp, self.g_edp, self.net_edp))

    def reduce(self, n_dense: float, n_expert: float, nbytes: int, buckets: int = 1) -> float:
        """Reduction of these many gradients: the reduce-scatter inside the ZeRO group, then under HSDP the
        all-reduce of each rank's shard across the replica groups."""
        t = self.gather(n_dense, n_expert, nbytes, buckets)
        if self.replicas > 1:
            shards = (n_dense * nbytes / buckets / self.n, n_expert * nbytes / buckets / self.edp)
            t += buckets * sum(coll.all_reduce(shard, self.replicas, self.g_rep, self.net_rep) for shard in shards)
        return t

    def per_layer(self, fwd: float, bwd: float) -> tuple[float, float, float]:
        """(exposed per layer forward, backward, once per step): ZeRO-2/3 collectives hide behind the
        layer they are prefetched for; the very first gather and the very last reduce-scatter show."""
        lay, hide = self.k.lay, self.hide
        if not (self.n > 1 and lay.zero >= 2) or self.whole_stage:
            return 0.0, 0.0, 0.0
        if self.deepspeed_2021:  # a weight at a time, one module ahead (deepspeed_zero3.py); its first gather included
            z = self.deepspeed_layer(fwd, bwd)
            return z.fwd, z.bwd, 0.0
        # Sizes are the full (unsharded) layer on this TP rank.
        rs = self.reduce(self.params.layer_dense, self.params.layer_expert, self.grad)
        ag = self.gather(self.params.layer_dense, self.params.layer_expert) if lay.zero == 3 else 0.0
        return overlap(ag, fwd, hide), overlap(ag + rs, bwd, hide), ag + rs

    def per_step(self, t_f: float, t_b: float, layer_fwd: float, layer_bwd: float) -> tuple[float, float]:
        """(total, exposed) seconds of the once-per-step data-parallel traffic."""
        k, lay, w, params, hide = self.k, self.k.lay, self.k.workload, self.params, self.hide
        layer_dense, layer_expert, m, layers = params.layer_dense, params.layer_expert, k.m, k.layers
        if lay.dp > 1 and w.diloco_inner_steps:
            # DiLoCo: no gradient traffic across ranks; the parameters' all-reduce every H steps, waited for
            # at once, or with overlap running beside that many steps' kernels (int8's and fp4's all-to-all is not)
            outer = 4 * QUANTIZED[w.diloco_quantize]
            b = self.bucket_count(params.dense * outer)
            sync = b * (coll.all_reduce(params.dense * outer / b, self.n, self.g_dp, self.net)
                        + coll.all_reduce(params.expert * outer / b, self.edp, self.g_edp, self.net_edp))
            quantized = w.diloco_quantize in ("int8", "fp4")
            beside = 0.0 if quantized else w.diloco_overlap_steps * m * (t_f + t_b)
            return sync / w.diloco_inner_steps, overlap(sync, beside, hide) / w.diloco_inner_steps
        if self.whole_stage:
            # A pipeline stage under FSDP (memory.stage_unsharded): each layer is gathered at its first forward
            # (prefetched beside the forward) and kept; the gradients are reduce-scattered once, after the stage's
            # last backward (pipelining's REDUCE_GRAD action), with nothing left to hide behind.
            regather = self.gather(params.dense, params.expert)
            sync = self.reduce(params.dense, params.expert, self.grad)
            return sync + regather, sync + overlap(regather, t_f, hide)
        if self.n > 1 and lay.zero <= 2:
            b = self.buckets
            if lay.zero == 0:
                sync = b * (coll.all_reduce(params.dense * self.grad / b, self.n, self.g_dp, self.net)
                            + coll.all_reduce(params.expert * self.grad / b, self.edp, self.g_edp, self.net_edp))
                regather = 0.0
            else:
                regather = self.gather(params.dense, params.expert, buckets=b)  # updated weights back to every rank
                # ZeRO-2 reduced its gradients per micro-batch
                sync = self.reduce(params.dense, params.expert, self.grad, buckets=b) if lay.zero == 1 else 0.0
            v = lay.virtual_stages
            total = sync + regather + (m * layers * self.reduce(layer_dense, layer_expert, self.grad)
                                       if lay.zero == 2 else 0.0)
            if not w.grad_overlap:  # reduced after the last backward, gathered after the step (Workload.grad_overlap)
                return total, sync + regather
            # A bucket's reduction starts once every gradient in it exists, so the one that fills last (the
            # rank's first layers, in the chunk that finishes last) shows whole: 1/b of the reduction, and
            # with fewer buckets than layers it also waits on layers/b layers' backward, not one. Megatron-
            # Core's buckets grow with dp (max(40M, 1M x dp) parameters, above), so at a fixed per-GPU batch
            # this exposed tail grows with the data-parallel size.
            chunk_buckets = max(1.0, b / v)
            last_bucket = sync / v / chunk_buckets
            waited = max(1.0, layers / v / chunk_buckets) * layer_bwd
            if v == 1:
                # The last micro-batch's backward, all but what the last bucket waits on, hides the rest.
                exposed = last_bucket + overlap(sync - last_bucket, max(0.0, t_b - waited), hide)
            else:
                # Interleaved: a chunk's gradients are final only after the last micro-batch's backward through
                # that chunk. The chunk that finishes last (1/v of the rank's parameters) has only its own
                # backward, t_b/v, to hide behind; the others overlap the rest of the cool-down.
                chunk = sync / v
                exposed = (last_bucket + overlap(chunk - last_bucket, max(0.0, t_b / v - waited), hide)
                           + overlap(sync - chunk, t_b * (v - 1) / v, hide))
            return total, exposed + self.gather_exposed(regather, t_f, layer_fwd, chunk_buckets)
        if self.n > 1 and self.deepspeed_2021:
            return m * layers * self.deepspeed_layer(layer_fwd, layer_bwd).traffic, 0.0
        if self.n > 1:
            return m * layers * (2 * self.gather(layer_dense, layer_expert)
                                 + self.reduce(layer_dense, layer_expert, self.grad)), 0.0
        return 0.0, 0.0


    def gather_exposed(self, regather: float, t_f: float, layer_fwd: float, chunk_buckets: float) -> float:
        """What the ZeRO-1/2 parameter all-gather adds to the first forward. ZeRO-1 as Megatron-Core's
        distributed optimizer runs it (--overlap-param-gather): the first module's forward pre-hook dispatches the
        first bucket's all-gather and waits for it, then each bucket's gather is dispatched when the one before
        completes (core/distributed/param_and_grad_buffer.py, finish_param_sync), so the first bucket shows whole
        and the others hide behind the forward of the layers before them. ZeRO-2 (FSDP's per-layer units) hides
        it behind the forward."""
        lay, hide = self.k.lay, self.hide
        if lay.zero != 1:
            return overlap(regather, t_f, hide)
        first = regather / lay.virtual_stages / chunk_buckets
        waited = max(1.0, self.k.layers / lay.virtual_stages / chunk_buckets) * layer_fwd
        return first + overlap(regather - first, max(0.0, t_f - waited), hide)
