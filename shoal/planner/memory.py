"""Memory per GPU for a layout, with a breakdown.

Model states follow the ZeRO paper (Rajbhandari et al. 2020): with mixed precision a parameter
costs 2 bytes (16-bit weight) + 2 (16-bit gradient) + K = 12 (fp32 master copy, Adam momentum and
variance), and each ZeRO stage shards one more of them over the data-parallel group (Table 1).
Activations follow Korthikanti et al. (2022): per-layer bytes, each layer as its own kind (dense or MoE),
times the layer-micro-batches the busiest pipeline stage holds (p micro-batches of L/p layers under 1F1B,
times 1 + (p-1)/(p·v) interleaved, all m under GPipe; under DualPipe p + 1 stage-micro-batches, and both
edge stages' parameters on one rank). The per-layer count is shoal's own layer (analytics.py) for flash attention,
or the paper's Table 2 for `attention="unfused"`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from shoal.layout import Layout
from shoal.model import analytics
from shoal.model.config import ModelConfig
from shoal.planner import context_parallel, deepspeed_zero3
from shoal.planner.workload import Cluster, Workload, expert_grid, moe_layer_count
from shoal.planner.pipeline import held_layer_microbatches, rank_stage_layer_ids, stage_copies
from shoal.planner.slow_links import extra_state_bytes

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb
FRAGMENTATION = 0.05
"""Caching-allocator slack, as a fraction of the memory that comes and goes (activations, buffers)."""

# bytes per parameter: (weights, gradients, optimizer state K) — ZeRO paper notation
STATE_BYTES = {"bf16": (2, 2, 12), "fp32": (4, 4, 8)}
STATE_BYTES["fp8"] = STATE_BYTES["bf16"]  # FP8 recipes keep bf16 weights and fp32 master/Adam state
STATE_BYTES["fp16"] = STATE_BYTES["bf16"]  # fp16 mixed precision: the same, plus one fp32 loss scale


def model_state_bytes(psi: float, dp: int, zero: int, precision: str = "bf16",
                      adam_moments: str = "fp32") -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per device for psi parameters: ZeRO paper Table 1.

    zero 0: 2Ψ + 2Ψ + KΨ;  1 (P_os): 2Ψ + 2Ψ + KΨ/N_d;  2 (P_os+g): 2Ψ + (2 + K)Ψ/N_d;
    3 (P_os+g+p): (2 + 2 + K)Ψ/N_d. BF16 Adam moments (Workload.adam_moments) take 2 bytes each off K.
    """
    w, g, k = STATE_BYTES[precision]
    k -= 4 if adam_moments == "bf16" else 0
    return (w * psi / (dp if zero >= 3 else 1),
            g * psi / (dp if zero >= 2 else 1),
            k * psi / (dp if zero >= 1 else 1))


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the busiest GPU."""

    params: float
    grads: float
    optimizer: float
    activations: float
    """Saved for backward, times the micro-batches in flight on the stage."""
    logits: float
    """Output logits in fp32 and their gradient (last stage), embedding outputs (first stage)."""
    buffers: float
    """Communication buffers: FSDP gathers, DDP buckets, sequence-parallel gathers, pipeline send/recv."""
    overhead: float
    """Framework allowance: CUDA context, NCCL, workspaces, allocator fragmentation."""
    stage: str
    """Which pipeline stage is the peak: 'first' or 'last' (or 'only' without pipelining; 'edges' under DualPipe,
    whose first pipeline rank holds the first and the last stage)."""
    capacity: float
    host: float = 0.0
    """Bytes offloading keeps in host memory for this GPU (not part of `total`, which is HBM)."""
    offloaded_share: float = 0.0
    """With activation offload: the share of the layers' saved activations that goes to the host (all but two
    layers' with save_on_cpu; with Transformer Engine's offload, the fewest layers that fit: memory())."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.logits + self.buffers + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "fits": self.fits}


@dataclass(frozen=True)
class RankParams:
    """Parameters on one GPU of a stage, split by the group that reduces their gradients."""

    dense: float
    """Reduced and sharded over the whole data-parallel group."""
    expert: float
    """Routed experts: reduced and sharded over dp/ep ranks."""
    layer_dense: float
    """One (average) layer's non-expert parameters on this GPU: what FSDP gathers at a time."""
    layer_expert: float
    """One (average) layer's routed-expert parameters on this GPU."""
    tensors: float = 0.0
    """Parameter tensors on this GPU (each is its own optimizer update where the update is not fused)."""

    @property
    def layer(self) -> float:
        return self.layer_dense + self.layer_expert


@lru_cache(maxsize=16384)
def rank_params(cfg: ModelConfig, tp: int, ep: int, pp: int, virtual: int, stage: str,
                expert_tp: int | None = None) -> RankParams:
    """Parameters of the first or last stage on one GPU: TP splits matrices, EP (and the expert TP, tp
    unless folded: workload.expert_grid) splits experts. The stage's own layers count: DeepSeek-V3's first
    three are dense (a 18,432-wide MLP where the others hold 1/ep of 256 experts), and they are stage 0's."""
    h = cfg.dim
    norms = 2 * h
    attn = analytics.attention_params_per_rank(cfg, tp)
    dense_mlp = analytics.mlp_params(cfg, cfg.ffn_hidden) / tp
    expert_mlp = analytics.mlp_params(cfg, cfg.expert_hidden)
    moe_fixed = h * cfg.n_experts + cfg.n_shared_experts * expert_mlp / tp  # router (replicated) + shared
    routed = cfg.n_experts * expert_mlp / (ep * (tp if expert_tp is None else expert_tp))
    ids = [i for chunk in rank_stage_layer_ids(cfg.n_layers, pp, virtual, "first" if stage == "first" else "last")
           for i in chunk]
    layers, n_moe = len(ids), sum(cfg.is_moe_layer(i) for i in ids)
    moe_share = n_moe / layers if layers else moe_layer_count(cfg) / cfg.n_layers  # a stage of only the head: the
    layer_dense = norms + attn + (1 - moe_share) * dense_mlp + moe_share * moe_fixed  # model's average layer
    dense = layers * layer_dense
    # Tensors as shoal's model holds them: two norm gains, wq wk wv wo, the MLP's two or three matrices;
    # an MoE layer has a router, each expert matrix stacked over the experts, and the shared expert's.
    mlp_tensors = 3 if cfg.mlp == "swiglu" else 2
    moe_tensors = 1 + mlp_tensors + (mlp_tensors if cfg.n_shared_experts else 0)
    tensors = layers * (6 + (1 - moe_share) * mlp_tensors + moe_share * moe_tensors)
    table = cfg.vocab_size * h / tp  # vocab-parallel embedding or head
    if pp == 1:
        dense += table + (0 if cfg.tie_embeddings else table) + h
        tensors += (2 if cfg.tie_embeddings else 3)
    elif stage == "first":
        dense += table
        tensors += 1
    else:
        dense += table + h  # a tied head keeps its own copy on the last stage
        tensors += 2
    return RankParams(dense=dense, expert=n_moe * routed,
                      layer_dense=layer_dense, layer_expert=moe_share * routed, tensors=tensors)


def stage_params(cfg: ModelConfig, lay: Layout, stage: str, expert_tp: int | None = None) -> RankParams:
    """rank_params of the stages one GPU holds: `stage`'s, or under DualPipe ('edges', or for the data-parallel
    traffic 'last') the first and the last stage together, which one pipeline rank holds (pipeline.py)."""
    if lay.pp_schedule != "dualpipe" or lay.pp == 1:
        return rank_params(cfg, lay.tp, lay.ep, lay.pp, lay.virtual_stages, stage, expert_tp)
    a, b = (rank_params(cfg, lay.tp, lay.ep, lay.pp, 1, s, expert_tp) for s in ("first", "last"))
    return RankParams(dense=a.dense + b.dense, expert=a.expert + b.expert, layer_dense=b.layer_dense,
                      layer_expert=b.layer_expert, tensors=a.tensors + b.tensors)


def activation_bytes_per_layer(workload: Workload, layout: Layout, recompute: str | None = None,
                               xla: bool = False) -> float:
    """Average bytes one layer saves for one micro-batch on one GPU (dense and MoE layers weighted)."""
    return _average_layer(workload.model, *layer_activation_bytes(workload, layout, recompute, xla))


def _average_layer(cfg: ModelConfig, dense: float, moe: float) -> float:
    n_moe = moe_layer_count(cfg)
    return (dense * (cfg.n_layers - n_moe) + moe * n_moe) / cfg.n_layers


def layer_activation_bytes(workload: Workload, layout: Layout, recompute: str | None = None,
                           xla: bool = False) -> tuple[float, float]:
    """(dense layer, MoE layer): bytes each saves for one micro-batch on one GPU. `xla`: the device runs the
    step as one XLA program (catalog.GPU.xla_step), whose `selective` is JAX's dots policy: the attention
    kernel's output is recomputed, not kept."""
    lay = layout
    per_sequence = _activation_bytes_by_kind(
        workload.model, workload.seq_len, lay.micro_batch, lay.tp, lay.sequence_parallel,
        lay.activation_checkpoint if recompute is None else recompute, workload.attention,
        4 if workload.precision == "fp32" else 2, workload.kernels == "fused",
        workload.precision == "fp8" and workload.fp8_saves == "fp8", workload.moe_probs, xla)
    # Context parallelism: each of cp ranks keeps its 1/cp of the sequence's tokens (flash attention keeps
    # no S×S matrix, so every saved tensor is per token); the K/V chunks a ring step received are freed.
    mask = document_mask_bytes(workload, lay, recompute)[0]
    return per_sequence[0] / lay.cp + mask, per_sequence[1] / lay.cp + mask


def document_mask_bytes(workload: Workload, lay: Layout, recompute: str | None = None) -> tuple[float, float]:
    """(per layer, per micro-batch) bytes document masks keep for backward. SDPA turns the boolean
    [micro-batch, 1, tokens here, seq] mask into an additive one in the compute dtype on every call and
    saves that, one per layer; a checkpointed layer (any recompute) makes it again in backward and saves
    the boolean mask it was given instead, one byte per score, once for all layers
    (tests/unit/test_planner_document_mask.py measures both)."""
    if not workload.document_mask:
        return 0.0, 0.0
    scores = lay.micro_batch * workload.seq_len / lay.cp * workload.seq_len
    if (recompute or lay.activation_checkpoint) == "none":
        return scores * (4 if workload.precision == "fp32" else 2), 0.0
    return 0.0, scores


@lru_cache(maxsize=65536)
def _activation_bytes_by_kind(cfg: ModelConfig, seq_len: int, micro_batch: int, tp: int, sp: bool,
                              recompute: str, attention: str, elem: int, fused: bool,
                              fp8: bool = False, moe_probs: str = "activation",
                              xla: bool = False) -> tuple[float, float]:
    if attention == "unfused":
        per_layer = analytics.korthikanti_activation_bytes_per_layer(
            seq_len, micro_batch, cfg.dim, cfg.n_heads, tp=tp, sequence_parallel=sp, recompute=recompute)
        return per_layer, per_layer
    kw = dict(tp=tp, sequence_parallel=sp, recompute=recompute, bytes_per_element=elem, fused=fused,
              gemm_input_bytes=1 if fp8 else None,  # FP8 GEMMs keep their FP8 inputs for backward
              moe_probs=moe_probs, attention_output_saved=not xla, elementwise_saved=not xla)
    n_moe = moe_layer_count(cfg)
    dense = 0.0 if n_moe == cfg.n_layers else analytics.activation_bytes_per_layer(
        cfg, seq_len, micro_batch, layer=_first_layer(cfg, moe=False), **kw)
    moe = 0.0 if n_moe == 0 else analytics.activation_bytes_per_layer(
        cfg, seq_len, micro_batch, layer=_first_layer(cfg, moe=True), **kw)
    return dense, moe


def _first_layer(cfg: ModelConfig, moe: bool) -> int:
    return next(i for i in range(cfg.n_layers) if cfg.is_moe_layer(i) == moe)


def memory(workload: Workload, layout: Layout, cluster: Cluster) -> MemoryBreakdown:
    """Peak memory of the busiest GPU (the larger of the first and the last pipeline stage)."""
    cfg, lay, gpu = workload.model, layout, cluster.gpu
    xla = bool(gpu.xla_step)
    elem = 4 if workload.precision == "fp32" else 2
    m = lay.microbatches(workload.global_batch)
    T = workload.seq_len * lay.micro_batch / lay.cp  # tokens of one micro-batch on this rank
    sp = lay.tp if lay.sequence_parallel else 1
    dense_layer, moe_layer = layer_activation_bytes(workload, layout, xla=xla)
    act_layer = _average_layer(cfg, dense_layer, moe_layer)
    first_held, last_held = held_layer_microbatches(cfg, lay.pp, lay.virtual_stages, lay.pp_schedule, m)
    # Full recompute: one layer's full activations while it is recomputed, the largest kind the rank holds
    recomputed = (layer_activation_bytes(workload, layout, "none", xla) if lay.activation_checkpoint == "full"
                  else (0.0, 0.0))
    logits_last = T * cfg.vocab_size / lay.tp * loss_bytes_per_logit(workload, elem, xla)
    # The embeddings' output (and a recomputed run's boolean document mask) of each micro-batch in flight.
    embed_first = (T * cfg.dim * elem / sp + document_mask_bytes(workload, lay)[1]) * (min(lay.pp, m) if lay.pp > 1 else 1)

    best = None
    stages = (("first", first_held, embed_first), ("last", last_held, logits_last))
    if lay.pp_schedule == "dualpipe" and lay.pp > 1:  # one rank holds both edge stages (pipeline.py)
        stages = (("edges", first_held, embed_first + logits_last),)
    copies = stage_copies(lay.pp_schedule) if lay.pp > 1 else 1
    etp, edp = expert_grid(lay)
    edp = max(1, edp // lay.hsdp_replicas) * copies  # the experts' ZeRO group, inside a replica group as the rest
    for stage, held, logits in stages:
        if lay.pp == 1:
            stage, logits = "only", embed_first + logits_last
        params = stage_params(cfg, lay, "last" if stage == "only" else stage, etp)
        # context-parallel ranks hold the same weights: ZeRO shards over them too (and over a DualPipe stage's
        # copies); under HSDP only within a replica group (Layout.zero_group)
        shard = lay.zero_group * copies
        w, g, o = model_state_bytes(params.dense, shard, lay.zero, workload.precision, workload.adam_moments)
        we, ge, oe = model_state_bytes(params.expert, edp, lay.zero, workload.precision, workload.adam_moments)
        psi = params.dense + params.expert
        o += extra_state_bytes(workload, psi, psi / (shard if lay.zero >= 2 else 1))
        working = max((b for b, n in zip(recomputed, held) if n), default=0.0)
        activations = held[0] * dense_layer + held[1] * moe_layer + working
        w, g = w + we, g + ge
        if stage_unsharded(lay, xla):
            w, g = psi * workload.gathered_weight_bytes, psi * GRAD_BUFFER_BYTES
        saved = activations
        w, g, o, activations, host = _offloaded(lay, w, g, o + oe, activations, act_layer, params, elem)
        buffers = _buffers(workload, layout, params.layer, T, elem, sp, copies, xla)
        slack = gpu.allocator_slack or FRAGMENTATION
        if lay.activation_offload and workload.offload_overlap and not xla:
            # Transformer Engine's offload takes a layer count (Megatron's cpu_offloading_num_layers, tuned per
            # recipe: Megatron-Bridge's Llama 3 70B offloads 40 of 80 layers on GB200, 20 on GB300): the fewest
            # layers that fit go out, the rest stay as saved.
            room = (gpu.hbm_bytes - gpu.reserved_bytes - w - g - o - (1 + slack) * (logits + buffers)) / (1 + slack)
            kept = min(saved, max(activations, room))
            host, activations = host - (kept - activations), kept
        offloaded = (saved - activations) / saved if lay.activation_offload and saved else 0.0
        if xla:  # the embedding outputs are the first layer's inputs, which its checkpoints hold already
            loss = logits_last if stage != "first" else 0.0
            activations, logits, buffers = _xla_peak(cfg, lay, activations, working, loss, buffers, elem)
        elif working and stage != "first" and not lay.activation_offload:
            # Eager too, the loss's tensors are gone before the last layer is recomputed: autograd frees a node's
            # saved tensors when its backward runs (the loss's, then the head's), and the caching allocator hands
            # their blocks to the recompute. Only what the loss holds beyond the recomputed layer adds to the peak.
            logits -= min(logits_last, working)
        dynamic = activations + logits + buffers
        bd = MemoryBreakdown(params=w, grads=g, optimizer=o, activations=activations,
                             logits=logits, buffers=buffers, overhead=gpu.reserved_bytes + slack * dynamic,
                             stage=stage, capacity=gpu.hbm_bytes, host=host, offloaded_share=offloaded)
        if best is None or bd.total > best.total:
            best = bd
        if lay.pp == 1:
            break
    return best


def _xla_peak(cfg: ModelConfig, lay: Layout, activations: float, working: float, loss: float, buffers: float,
              elem: int) -> tuple[float, float, float]:
    """(activations, logits, buffers) alive at the peak of an XLA program (catalog.GPU.xla_step): the larger of
    two points of its schedule, which eager PyTorch's count adds together. At the output head's backward every
    layer's checkpoints are held, with the loss's vocabulary-wide tensors (`loss`) and, under ZeRO-3, the
    head's gathered weights and their gradient; at the last layer's backward the same checkpoints, that layer's
    recomputed activations (`working`) and `buffers`, the loss's tensors freed. XLA checks the largest set of
    buffers alive at one point of the program against the HBM (openxla/xla docs/errors/error_1000.md), so
    this is the number it compiles to."""
    head = 0.0
    if loss and lay.zero == 3 and lay.zero_group > 1:  # the vocab-parallel head, gathered, and its gradient
        head = 2 * cfg.vocab_size * cfg.dim / lay.tp * elem
    if loss + head > working + buffers:
        return max(0.0, activations - working), loss, head
    return activations, 0.0, buffers


OFFLOAD_RESIDENT_LAYERS = 2
"""Layers whose offloaded tensors sit in HBM at once: the one computing and the one being prefetched
(DeepSpeed ZeRO-Infinity's and torchao/FSDP2 CPU offload's double buffer)."""


def stage_unsharded(lay: Layout, xla: bool) -> bool:
    """Whether a pipeline stage sharded by FSDP (zero 2/3) holds its weights and gradients whole for most of
    the step. torch.distributed.pipelining runs every micro-batch's backward with FSDP2's gradient sync and
    its re-shard after backward turned off (stage.py, backward_maybe_with_nosync) and reduces once, after
    the last (perform_reduce_grad); FSDP2 then keeps each unsharded gradient, accumulated in the reduce dtype
    (fp32: _fsdp_param_group.post_backward, to_accumulated_grad_if_needed), and after a backward every layer
    of the stage is still gathered. So such a rank holds its stage's 16-bit weights and fp32 gradients
    unsharded, beside the sharded optimizer state: shoal train and torchtitan, which both pipeline through
    it. (Megatron-Core and DeepSpeed pipeline with ZeRO-1 at most.) An XLA program shards as it compiles."""
    return lay.pp > 1 and lay.zero >= 2 and lay.zero_group > 1 and not xla


def _offloaded(lay: Layout, w: float, g: float, o: float, activations: float, act_layer: float,
               params: RankParams, elem: int) -> tuple[float, float, float, float, float]:
    """(params, grads, optimizer, activations in HBM, bytes in host memory) once offloading moves them.

    optimizer: the fp32 master weights and Adam moments live on the host, where the update runs
    (ZeRO-Offload, Ren et al. 2021); params: the 16-bit weights and gradients too, a layer at a time
    coming over PCIe (ZeRO-Infinity); activation_offload: saved activations go to the host after each
    layer's forward and come back before its backward."""
    host = 0.0
    if lay.offload in ("optimizer", "params"):
        host, o = host + o, 0.0
    if lay.offload == "params":
        resident = OFFLOAD_RESIDENT_LAYERS * params.layer
        host += w + g
        w, g = resident * elem, resident * GRAD_BUFFER_BYTES
    if lay.activation_offload:
        resident = min(activations, OFFLOAD_RESIDENT_LAYERS * act_layer)
        host += activations - resident
        activations = resident
    return w, g, o, activations, host


LOSS_BYTES_FUSED = 8
"""Bytes per logit the loss holds at its peak with a fused cross-entropy: fp32 logits and their gradient."""
MEGATRON_LOSS_BYTES = 4
"""Beyond the logits' own dtype: Megatron-Core's fused_vocab_parallel_cross_entropy (cross_entropy_fusion_impl
"native") keeps the fp32 exp(logits) (fusions/fused_cross_entropy.py saves exp_logits), turns it into the
gradient in place in backward, and the upcast's backward casts that to the logits' dtype beside it."""


XLA_LOSS_BYTES = 4
"""Bytes per logit an XLA program's loss holds: the fp32 logits (MaxText's cast_logits_to_fp32, on by default).
The softmax, its gradient and the one-hot targets are element-wise in them and the program is one module, so XLA
makes them inside the ops that read them (the loss's reductions, the output head's backward GEMMs) rather than
keep them, although MaxText's loss (max_utils.cross_entropy_with_logits, a custom_vjp) names them as residuals.
Measured with that loss on XLA's CPU backend: 4.03-4.13 temporary bytes per logit, the head's weights included
(bench/xla_remat_check.py). A published run bounds it too: MaxText's Llama 3.1 70B on 256 TPU v6e (5 sequences of
8,192 a chip, vocabulary 128,256: 5.3e9 logits a chip) fits the chip's 31.25 GiB, which the fp32 logits and
their gradient (39 GiB) alone would not."""


def loss_bytes_per_logit(workload: Workload, elem: int, xla: bool = False) -> float:
    """Bytes per logit the loss holds at the last stage's peak (Workload.loss); `xla`: the step is one XLA program."""
    if xla:
        return XLA_LOSS_BYTES
    if workload.kernels == "eager":
        return elem + LOSS_BYTES_EAGER
    if workload.loss == "te":  # the gradient written over the logits in forward: they are all it keeps
        return elem
    return MEGATRON_LOSS_BYTES + elem if workload.loss == "megatron" else LOSS_BYTES_FUSED
LOSS_BYTES_EAGER = 12
"""Beyond the caller's logits (elem bytes each), what eager F.cross_entropy over upcast logits holds while
its backward runs: the fp32 log-probabilities log_softmax saved, their gradient and the fp32 logits'
gradient, 4 bytes each (shoal/model/transformer.cross_entropy). Measured on an H200 (docs/debugging.md):
an eager 1B run at micro-batch 8 peaked 24.4 GiB above the planner's 8 bytes per logit, 6.2 bytes more
per logit over its 4.2e9 logits; 2 + 12 is 6 more."""

GRAD_BUFFER_BYTES = 4
"""A layer's gradients wait in fp32 for their reduction before they leave (data_parallel.GRAD_REDUCE_BYTES)."""


def _buffers(workload: Workload, lay: Layout, layer_params: float, T: int, elem: int, sp: int,
             chunks: int = 1, xla: bool = False) -> float:
    """`chunks`: micro-batch chunks computing at once, each with its own sends and all-to-all buffers (2 for a
    DualPipe F&B pair, DeepSeek-V3 §3.2.1). `xla` (catalog.GPU.xla_step): a scanned layer's weights are
    gathered in its own iteration, none prefetched beside them, and its gradients reduced in the compute
    dtype before the cast back to the fp32 weights: one layer's weights and gradients, elem bytes each
    (MaxText's custom-model guide, docs/guides/optimization/custom_model.md at e591f30c: pure FSDP must "hold
    ... a full, single layer of weights", "10B params per layer, which corresponds to 40GiB of bf16 weights
    and gradients")."""
    cfg = workload.model
    out = 0.0
    grad = elem if xla else GRAD_BUFFER_BYTES
    if stage_unsharded(lay, xla):
        pass  # the whole stage is gathered already (memory's weights and gradients)
    elif lay.zero_group > 1 and lay.zero == 3 and workload.zero3_impl == "deepspeed-2021":  # a module at a time
        out += deepspeed_zero3.buffer_elements(deepspeed_zero3.module_weights(cfg, layer_params)) * elem
    elif lay.zero_group > 1 and lay.zero == 3:  # the gathered layer (+ the prefetched one, eager FSDP); its gradients
        out += (1 if xla else 2) * layer_params * workload.gathered_weight_bytes + layer_params * grad
    elif lay.zero_group > 1 and lay.zero == 2:
        out += layer_params * grad  # one layer's gradients being reduce-scattered
    elif lay.dp * lay.cp > 1:
        out += 2 * DDP_BUCKET_BYTES
    if lay.tp > 1 and lay.sequence_parallel:
        out += 2 * T * cfg.dim * elem  # all-gathered sequence for the column-parallel matmuls
    if lay.pp > 1:
        out += chunks * 4 * T * cfg.dim * elem / sp  # activations and gradients, sent and received
    if lay.ep > 1:
        out += chunks * 2 * T * cfg.top_k * cfg.dim * elem / lay.tp  # dispatch and combine
    # Context parallelism's K/V exchange, by the way the stack runs it (Workload.cp_comm)
    out += context_parallel.buffer_bytes(cfg, T, lay.tp, lay.cp, workload.cp_comm, elem)
    return out
