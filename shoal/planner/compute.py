"""Kernel time of one transformer layer (and of the output head) on one GPU, for one micro-batch.

A roofline per kernel: a GEMM takes max(FLOPs / achievable FLOP/s, bytes / achievable HBM bytes/s);
attention runs at the device's fused-attention rate; norms, activations, residual adds, rotary and
(unfused) softmax/dropout are memory-bound and cost the bytes they read and write. Backward GEMMs
do twice the forward FLOPs (data and weight gradients); backward elementwise kernels move about
twice the forward bytes (they read the saved input and the incoming gradient, write a gradient).

Communication is not here (see timing.py): these are the kernels between collectives.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from shoal.model.analytics import attention_core_width, kv_heads_per_rank, kv_width
from shoal.model.config import ModelConfig
from shoal.hardware.gpu import GPU
from shoal.hardware.local import is_local
from shoal.planner.context_parallel import ring_pass_bytes


@dataclass(frozen=True)
class KernelTime:
    """Seconds for one micro-batch through one layer (or the head) on one GPU."""

    fwd: float
    """Forward kernels."""
    bwd: float
    """Backward kernels (no recomputation)."""
    attn_fwd: float
    """The attention core (and, unfused, its softmax and dropout over S×S)."""
    gemm_fwd: float
    """The part of fwd spent in GEMMs (for the breakdown)."""
    selective_fwd: float = 0.0
    """What selective activation checkpointing repeats in backward (shoal/layout.py's meaning): the
    element-wise kernels between the saved GEMM and fused-attention outputs. With unfused attention
    it is Korthikanti's selective recompute instead, the S×S attention core, as the 2021-22 runs
    this mode is for did it. On an XLA device (catalog.GPU.xla_step) the attention forward too, whose
    output JAX's dots policy does not keep."""
    op_fwd: float = 0.0
    """What selective-op checkpointing repeats (torchtitan's per-op policy, shoal/layout.py): the
    selective work plus every second forward GEMM in call order, wk, wo and w3 (w2 with GeLU). In an
    MoE layer the matmuls after attention are the router and one to three per expert, taken as half."""
    full_fwd: float = 0.0
    """What full recomputation repeats: the whole forward (torch.utils.checkpoint reruns the block), or on
    an XLA device (catalog.GPU.xla_step) the forward less the MLP's down-projection, whose output only joins
    the residual stream: nothing in the layer's backward reads it, so XLA's dead-code elimination drops it
    from the recomputed forward (in an MoE layer the shared experts' down-projections; a routed expert's
    output is read again by the router's gradient)."""


def gemm_time(m: float, k: float, n: float, gpu: GPU, precision: str) -> float:
    """An (m x k) @ (k x n) GEMM, roofline: compute-bound unless it is skinny."""
    if m <= 0 or k <= 0 or n <= 0:
        return 0.0
    elem = {"fp32": 4, "fp8": 1}.get(precision, 2)
    flops = 2.0 * m * k * n
    moved = elem * (m * k + k * n) + max(elem, 2) * m * n  # FP8 GEMMs write a 16-bit output
    return max(flops / gpu.matmul_rate(precision), moved / (gpu.hbm_bandwidth * gpu.hbm_efficiency))


# Kernels per layer forward in an eager PyTorch layer (norms, projections, rotary, attention,
# activation, residual adds); backward launches about twice as many. MoE adds routing, permutation
# and one GEMM pair per local expert.
DENSE_LAYER_KERNELS = 24
MOE_EXTRA_KERNELS = 10
HEAD_KERNELS = 6


# The host's side of shoal's eager MoE layer (shoal/model/moe.py). Its routing ends in a host sync
# (GroupedExperts.forward: counts_E.tolist(); with ep > 1 the dispatcher's split sizes, expert_parallel.py),
# so when the host starts issuing the experts' ops the device's queue is empty, and from then on each op
# runs as soon as the host has issued it: the layer takes the longer of its kernels and the host's time to
# issue its ops (moe_host_time). Backward runs in autograd's C++ engine with no sync, but its per-expert ops
# are as small (a 512-token expert's GEMM is a few microseconds on an H200) and the host issues them one by
# one too: measured, the GPU sat idle 71% of a 128-expert step (docs/debugging.md), which forward alone
# cannot idle; so backward is host-bound the same way. Counted with a TorchDispatchMode that sees every aten
# op, views included, under bf16 autocast (tests/unit/test_moe_host.py counts them again), forward and backward:
# - per local expert 10 and 22 ops, 3 and 6 of them GEMMs (x @ w1, x @ w3, h @ w2 and their two gradients
#   each; autocast casts x twice and each weight slice, a non-leaf, every time: 5 casts, and 5 back);
# - per shared expert (a plain SwiGLU MLP) 14 and 32, 3 and 6 GEMMs;
# - the rest of the layer (norms, attention, the router, sorting and scattering the tokens) 128 and 179,
#   5 and 10 GEMMs (q, k, v, o and the router).
MOE_HOST_OPS_PER_EXPERT, MOE_HOST_GEMMS_PER_EXPERT = (10, 22), (3, 6)
MOE_HOST_OPS_PER_SHARED, MOE_HOST_GEMMS_PER_SHARED = (14, 32), (3, 6)
MOE_HOST_OPS_PER_LAYER, MOE_HOST_GEMMS_PER_LAYER = (128, 179), (5, 10)

LOCAL_OPS_PER_COUNTED_KERNEL = 967 / 306
"""The `local` profile's kernel_gap is seconds per kernel the planner counts (DENSE_LAYER_KERNELS), measured on
the `debug` model's forward and backward (measure/local_profile.py); that step dispatches 967 aten ops, views
included, for the 306 kernels counted (same counter, tests/unit/test_moe_host.py): 3.16 ops per counted kernel."""


def host_op_cost(gpu: GPU) -> tuple[float, float]:
    """(seconds per eager op, per GEMM op) the host takes to issue: the catalog's measured host costs, or on
    the `local` CPU (which is its own host) its measured kernel_gap per dispatched op."""
    if gpu.host_op_cost:
        return gpu.host_op_cost, gpu.host_gemm_cost or gpu.host_op_cost
    per_op = gpu.kernel_gap / LOCAL_OPS_PER_COUNTED_KERNEL
    return per_op, per_op


def moe_host_time(cfg: ModelConfig, gpu: GPU, ep: int, *, experts_only: bool = False) -> tuple[float, float]:
    """Seconds the host takes to issue one eager MoE layer's ops (its n_experts/ep local experts, shared
    experts and, unless `experts_only`, the rest of the layer), forward and backward (the counts above)."""
    per_op, per_gemm = host_op_cost(gpu)
    local, shared, rest = cfg.n_experts / ep, float(cfg.n_shared_experts), 0.0 if experts_only else 1.0

    def side(i: int) -> float:
        ops = rest * MOE_HOST_OPS_PER_LAYER[i] + local * MOE_HOST_OPS_PER_EXPERT[i] + shared * MOE_HOST_OPS_PER_SHARED[i]
        gemms = (rest * MOE_HOST_GEMMS_PER_LAYER[i] + local * MOE_HOST_GEMMS_PER_EXPERT[i]
                 + shared * MOE_HOST_GEMMS_PER_SHARED[i])
        return (ops - gemms) * per_op + gemms * per_gemm

    return side(0), side(1)


# Element-wise traffic of an eager PyTorch layer under bf16 mixed precision, in 16-bit-element
# equivalents (2 bytes) per token, forward; backward moves about twice as much. Counted op by op from the
# eager Llama block that torchtitan trains (torchtitan/models/llama/model.py: RMSNorm `_norm(x.float())
# .type_as(x) * weight`, complex-form rotary in fp32, `output.transpose(1, 2).contiguous()`, SwiGLU
# `silu(w1 x) * w3 x`); shoal's own block (shoal/model/transformer.py) does about the same work (its
# rotary rotates halves and its SDPA takes GQA heads as they are). Every op is
# its own kernel that reads its inputs from HBM and writes its output there:
# - each RMSNorm: upcast (read 2 B, write 4), square (4, 4), mean (4), scale by the rsqrt (4, 4),
#   downcast (4, 2), weight multiply (2, 2): 36 bytes = 18 elements per channel; two norms 36;
# - two residual adds, each reads two and writes one: 6;
# - rotary on q and k in fp32: upcast (2, 4), complex multiply (4, 4), downcast (4, 2): 10 per element;
# - the attention output's transpose back to [tokens, heads x dim] is a copy: 2 per element of q;
# - SwiGLU: silu reads and writes f (2), the product reads two and writes one (3): 5 per element of f;
#   a GELU MLP applies one fused kernel: 2.
# (Before this count the model used 26 per channel, 6 per rotary element and 3 per SwiGLU element.)
EAGER_OUTSIDE_ELEMS = 42
EAGER_ROTARY_PASSES = 10
EAGER_ATTN_OUT_COPY = 2
EAGER_GLU_ELEMS, EAGER_GELU_ELEMS = 5, 2

# Moving an MoE layer's tokens to their experts and back, in 16-bit element-equivalents per (token, chosen
# expert) pair and hidden channel, forward (backward about twice). Counted op by op from shoal's layer
# (shoal/model/moe.py: the gather x_ND[token_of] reads and writes a copy, 2; the product with the routing
# weights reads and writes it, 2; index_add_ back reads it, 1) and, with ep > 1, its dispatcher
# (shoal/parallel/expert_parallel.py: tokens arrive grouped by source rank and are re-sorted by expert,
# x_recv[order], and put back, index_copy, 2 each). Megatron-Core's alltoall dispatcher does the same
# passes (moe_utils.permute, sort_chunks_by_idxs after the dispatch and before the combine, unpermute:
# the probs product and scatter_add). (Before this count the model used 4 in all.)
MOE_PERMUTE_ELEMS = 5
MOE_EP_SORT_ELEMS = 4

# FP8 (Transformer Engine's recipe): each GEMM input is cast to FP8 by a kernel that reads it in 16 bits and
# writes one byte (the amax it needs is taken in the same pass), 1.5 element-equivalents per input element:
# the inputs of QKV and of the first MLP GEMM(s) (h each), of the output projection (q_dim) and of the last
# MLP GEMM (f). Weights are cast once per step and cached across micro-batches (Megatron's
# is_first_microbatch), so they are left out. Attention, norms and the output head stay in 16 bits.
FP8_CAST_ELEMS = 1.5


MASKED_ATTENTION_SHARE = 0.62
"""How much of its causal rate a GPU's fused attention keeps when it is given an explicit mask (document
masks, data.document_mask: SDPA's attn_mask): it can no longer skip the blocks above the diagonal, so it does
the whole S×S, and it reads the mask for every score tile. Measured on the H200 with cuDNN's kernel, forward
and backward together: 3.06-3.29x the causal kernel's time at seq 4096/8192 and 8 or 32 heads
(docs/measurements/h200-kernels.json, bench/gpu_kernels.py), i.e. twice the work at 0.61-0.65 of the rate.
On the `local` CPU the mask only costs the skipped half: 1.8-2.2x causal at 2048-4096 tokens, the same as
attention with no mask at all (measured with SDPA's CPU flash kernel, one thread), so the share is 1 there."""

ATTENTION_SCORE_MATMUL_FLOPS_128 = 14 * 128
"""Matmul FLOPs per causal score, forward and backward, at head dim 128: QK^T and PV forward (4·d),
2.5 times that backward (catalog.attention_efficiency's count)."""


def attention_rate(gpu: GPU, kernel: str, head_dim: float, precision: str) -> float:
    """FLOP/s of fused causal attention in FlashAttention's count. `kernel`: flash (the device's own
    kernel) or flash2 (FlashAttention-2: the catalog's flash2 share). The catalog's efficiency holds at
    head dim 128; per score the matmuls do 14·d FLOPs and the work beside them (gpu.attention_score_cost)
    stays, so the time per FLOP grows by c·(1/(14·d) - 1/1792) peak-FLOP-times at smaller d."""
    efficiency = gpu.attention_efficiency
    if kernel == "flash2" and gpu.flash2_attention_efficiency:
        efficiency = gpu.flash2_attention_efficiency
    slower = 1.0 + gpu.attention_score_cost * efficiency * (1.0 / (14.0 * head_dim) - 1.0 / ATTENTION_SCORE_MATMUL_FLOPS_128)
    return gpu.peak_flops(precision) * efficiency * gpu.sustained_scale / slower


def _per_kernel(gpu: GPU, tp: int) -> float:
    """What each counted kernel costs beyond its work; tensor-parallel layers run on DTensors."""
    return gpu.kernel_gap + (gpu.tp_kernel_overhead if tp > 1 else 0.0)


def _stream(nbytes: float, gpu: GPU) -> float:
    return nbytes / (gpu.hbm_bandwidth * gpu.hbm_efficiency)


@lru_cache(maxsize=65536)
def layer_time(cfg: ModelConfig, gpu: GPU, seq_len: int, micro_batch: int, tp: int, sequence_parallel: bool,
               attention: str, precision: str, moe: bool, ep: int, cp: int = 1, kernels: str = "fused",
               document_mask: bool = False, cp_comm: str = "p2p", cp_compiled: bool = True,
               expert_tp: int = 0) -> KernelTime:
    """Kernel time of one layer; `moe` picks an MoE layer (routed experts over ep ranks, split expert_tp ways, or tp
    where 0: the same FLOPs in GEMMs of another shape). Under context parallelism each cp rank runs 1/cp of the
    attention: its tokens (balanced causal chunks) in cp kernels, or under `a2a` its heads in one, with
    `cp_comm`'s copies. With `kernels` eager an MoE layer is shoal's own, its ops issued one by one after a host
    sync: it takes at least the host's time to issue them (moe_host_time; on the `local` CPU that time adds to the
    work). With `document_mask` attention takes an explicit mask (MASKED_ATTENTION_SHARE)."""
    elem = 4 if precision == "fp32" else 2  # activations: FP8 runs keep them in bf16 between GEMMs
    core = "bf16" if precision == "fp8" else precision  # attention runs in 16 bits under FP8 too
    T = float(seq_len * micro_batch) / cp  # tokens through the TP group
    h, hd = cfg.dim, cfg.head_size
    # kv_dim: the k/v width over the tp group (tp heads' worth where replicated: each rank computes one)
    q_dim, kv_dim = cfg.n_heads * hd, tp * kv_heads_per_rank(cfg, tp) * hd
    sp = tp if sequence_parallel else 1
    glu = cfg.mlp == "swiglu"

    up = 0.0  # MLA's up-projections, run again under selective recompute (analytics.mla_up_flops)
    if cfg.is_mla:
        gemm, every_second, up = _mla_projections(cfg, gpu, T, tp, precision)
        kv_dim = kv_width(cfg)  # k and v after the up-projection, for the element-wise passes below
    else:
        # Attention projections: column-parallel QKV, row-parallel output.
        gemm = gemm_time(T, h, (q_dim + 2 * kv_dim) / tp, gpu, precision) + gemm_time(T, q_dim / tp, h, gpu, precision)
        every_second = gemm_time(T, h, kv_dim / tp, gpu, precision) + gemm_time(T, q_dim / tp, h, gpu, precision)  # wk, wo
    attention_gemm = gemm
    # Feed-forward.
    if moe:
        f = cfg.expert_hidden
        etp = expert_tp or tp  # tokens from the ep group land on local experts, seen by each of an expert's etp ranks
        tokens_per_expert = T * cfg.top_k * ep / cfg.n_experts * etp / tp
        expert = (gemm_time(tokens_per_expert, h, (2 if glu else 1) * f / etp, gpu, precision)
                  + gemm_time(tokens_per_expert, f / etp, h, gpu, precision))
        shared_f = cfg.n_shared_experts * f
        gemm += cfg.n_experts / ep * expert + gemm_time(T, h, cfg.n_experts, gpu, precision)  # local experts, router
        down = gemm_time(T, shared_f / tp, h, gpu, precision)  # gemm_time is 0 without shared experts
        gemm += gemm_time(T, h, (2 if glu else 1) * shared_f / tp, gpu, precision) + down
        every_second += (gemm - attention_gemm) / 2
        act = EAGER_GLU_ELEMS if glu else EAGER_GELU_ELEMS
        act_elems = cfg.top_k * act * f / tp + act * shared_f / tp
        act_elems += (MOE_PERMUTE_ELEMS + (MOE_EP_SORT_ELEMS if ep > 1 else 0)) * cfg.top_k * h / tp
    else:
        f = cfg.ffn_hidden
        down = gemm_time(T, f / tp, h, gpu, precision)
        gemm += gemm_time(T, h, (2 if glu else 1) * f / tp, gpu, precision) + down
        every_second += gemm_time(T, h, f / tp, gpu, precision) if glu else gemm_time(T, f / tp, h, gpu, precision)  # w3 / w2
        act_elems = (EAGER_GLU_ELEMS if glu else EAGER_GELU_ELEMS) * f / tp

    # Attention core. FLOPs of QK^T and PV: 4·T·S·H per layer, over tp (H: q_dim, or MLA's mean width).
    core_flops = 4.0 * T * seq_len * attention_core_width(cfg) / tp
    if attention != "unfused":
        ring = ring_pass_bytes(cfg, T, tp, cp, cp_comm, elem, cp_compiled)
        attn_fwd, attn_bwd = _fused_attention_time(cfg, gpu, core_flops, T * seq_len, attention, core, elem,
                                                   document_mask, ring)
        outside = EAGER_OUTSIDE_ELEMS * h
        inside = (EAGER_ROTARY_PASSES * (q_dim + kv_dim) + EAGER_ATTN_OUT_COPY * q_dim) / tp + act_elems
    else:
        # Megatron before flash attention: batched GEMMs over the full S×S, then scale-mask-softmax,
        # dropout and their masks in HBM: about 13 bytes per score forward and 19 backward (16-bit).
        rate = gpu.matmul_rate(core)
        scores = cfg.n_heads * float(seq_len) * seq_len * micro_batch / tp / cp
        attn_fwd = core_flops / rate + _stream(13 * scores * elem / 2, gpu)
        attn_bwd = 2 * core_flops / rate + _stream(19 * scores * elem / 2, gpu)
        # Layer norms, bias-dropout-add with 1-byte masks; bias-GeLU inside the TP region.
        outside, inside = 11 * h, act_elems
    if precision == "fp8":
        outside += FP8_CAST_ELEMS * 2 * h
        # an MoE layer casts the first expert GEMM's input per (token, expert) copy, after the dispatch
        inside += FP8_CAST_ELEMS * (q_dim + (cfg.top_k * (f + h) - h if moe else f)) / tp
    elementwise = _stream(T * (outside / sp + inside) * elem, gpu)
    gaps = _counted_kernels(cfg, gpu, moe, kernels, ep, cp, cp_comm) * _per_kernel(gpu, tp)
    # JAX's dots policy (an XLA device's selective) keeps no attention output: the attention forward reruns
    selective = (attn_fwd if attention == "unfused" else elementwise + (attn_fwd if gpu.xla_step else 0.0)) + up
    fwd, bwd = gemm + attn_fwd + elementwise + gaps, 2 * gemm + attn_bwd + 2 * elementwise + 2 * gaps
    if moe and _host_bound_moe(gpu, kernels):
        fwd, bwd = _wait_for_host(fwd, bwd, cfg, gpu, ep)
    return KernelTime(fwd=fwd, bwd=bwd, attn_fwd=attn_fwd, gemm_fwd=gemm, selective_fwd=selective,
                      op_fwd=selective + every_second, full_fwd=fwd - (down if gpu.xla_step else 0.0))


def _counted_kernels(cfg: ModelConfig, gpu: GPU, moe: bool, kernels: str, ep: int, cp: int, cp_comm: str) -> float:
    """Kernels one layer's forward launches: the dense layer's, an MoE layer's routing and its local experts' GEMM
    pairs (an eager MoE layer's on the `local` CPU are counted by moe_host_time instead), and the attention calls
    beyond one: cp of them round a context-parallel ring, one under Ulysses (`a2a`)."""
    on_host = moe and kernels == "eager" and is_local(gpu)
    experts = (MOE_EXTRA_KERNELS + (0 if on_host else 2 * cfg.n_experts / ep)) if moe else 0
    return DENSE_LAYER_KERNELS + experts + (0 if cp_comm == "a2a" else cp - 1)


def _fused_attention_time(cfg: ModelConfig, gpu: GPU, core_flops: float, scores: float, attention: str,
                          precision: str, elem: int, document_mask: bool,
                          ring: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """Forward and backward of fused attention. Causal, it skips the upper triangle (half the work);
    backward does 2.5x the forward FLOPs because it recomputes the scores. Given an explicit mask it cannot
    skip, and SDPA makes the boolean mask (`scores`: micro-batch x tokens here x seq) additive on every call.
    `ring`: the bytes context parallelism's merges and copies move around the calls (forward, backward), part of
    the attention op (context_parallel.ring_pass_bytes): a full recompute repeats them, selective does not."""
    rate = attention_rate(gpu, attention, attention_core_width(cfg) / cfg.n_heads, precision)
    merges_fwd, merges_bwd = _stream(ring[0], gpu), _stream(ring[1], gpu)
    if not document_mask:
        fwd = 0.5 * core_flops / rate
        return fwd + merges_fwd, 2.5 * fwd + merges_bwd
    fwd = core_flops / (rate * (1.0 if is_local(gpu) else MASKED_ATTENTION_SHARE))
    # the mask: read 1 byte, write elem
    return fwd + _stream(scores * (1 + elem), gpu) + merges_fwd, 2.5 * fwd + merges_bwd


def _host_bound_moe(gpu: GPU, kernels: str) -> bool:
    """Whether an MoE layer waits for its host. On a GPU, dropless routing syncs the host before the experts
    whatever the stack: shoal's layer (above), and Megatron-Core's alltoall dispatcher, which waits on the
    stream for the split sizes before the expert-parallel exchange (moe/token_dispatcher.py, cuda_sync_point
    "before_ep_alltoall"; "before_finish" without ep), fused kernels or not (torch.compile breaks its graph at
    the sync). How many ops the host then issues per expert is measured for shoal's layer only; it stands for
    the others (an estimate: Transformer Engine issues its grouped GEMMs' per-expert casts and GEMMs from C++).
    XLA compiles static shapes (capacity-padded experts) and syncs nothing; the `local` CPU is its own host, so
    only its eager dispatch is counted."""
    if gpu.xla_step:
        return False
    return kernels == "eager" or not is_local(gpu)


def _wait_for_host(fwd: float, bwd: float, cfg: ModelConfig, gpu: GPU, ep: int) -> tuple[float, float]:
    """An eager MoE layer's forward and backward: on a GPU the longer of its kernels and the host's time to
    issue its ops (the routing's sync empties the device's queue); on the `local` CPU, its own host, the
    experts' dispatch adds to the work."""
    if is_local(gpu):
        host_fwd, host_bwd = moe_host_time(cfg, gpu, ep, experts_only=True)
        return fwd + host_fwd, bwd + host_bwd
    host_fwd, host_bwd = moe_host_time(cfg, gpu, ep)
    return max(fwd, host_fwd), max(bwd, host_bwd)


def _mla_projections(cfg: ModelConfig, gpu: GPU, T: float, tp: int, precision: str) -> tuple[float, float, float]:
    """(all, every second, the up-projections) GEMM time of MLA's projections (DeepSeek-V2 §2.1): the
    down-projections to the query and key/value latents whole on every tp rank (Megatron-Core's
    "duplicated" linears), the up-projections column-parallel and the output projection row-parallel,
    split by heads."""
    h, n, qk, v, rope = cfg.dim, cfg.n_heads, cfg.head_size, cfg.v_head_size, cfg.qk_rope_head_dim
    q_down = gemm_time(T, h, cfg.q_lora_rank, gpu, precision) if cfg.q_lora_rank else 0.0
    q_up = gemm_time(T, cfg.q_lora_rank or h, n * qk / tp, gpu, precision)
    kv_down = gemm_time(T, h, cfg.kv_lora_rank + rope, gpu, precision)
    kv_up = gemm_time(T, cfg.kv_lora_rank, n * (qk - rope + v) / tp, gpu, precision)
    out = gemm_time(T, n * v / tp, h, gpu, precision)
    return q_down + q_up + kv_down + kv_up + out, kv_up + out, q_up + kv_up


@lru_cache(maxsize=4096)
def head_time(cfg: ModelConfig, gpu: GPU, seq_len: int, micro_batch: int, tp: int, precision: str,
              cp: int = 1) -> KernelTime:
    """The output projection (vocab-parallel over tp) and the fp32 cross-entropy, on the last stage, for
    this rank's 1/cp of the tokens. FP8 recipes keep the output head in 16 bits."""
    T = float(seq_len * micro_batch) / cp
    gemm = gemm_time(T, cfg.dim, cfg.vocab_size / tp, gpu, "bf16" if precision == "fp8" else precision)
    # Logits upcast to fp32, softmax, loss: about three fp32 passes over the logits forward, two backward.
    logits = T * cfg.vocab_size / tp * 4
    gaps = HEAD_KERNELS * _per_kernel(gpu, tp)
    return KernelTime(fwd=gemm + _stream(3 * logits, gpu) + gaps, bwd=2 * gemm + _stream(2 * logits, gpu) + 2 * gaps,
                      attn_fwd=0.0, gemm_fwd=gemm)
