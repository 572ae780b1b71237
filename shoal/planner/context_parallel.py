"""Context parallelism's cost beyond the attention it splits, per layer and micro-batch, for each way a stack
runs it (Workload.cp_comm): the exchange of keys and values (what of it shows beside the attention kernels) and
the extra element-wise passes its merges and copies make (compute.layer_time adds them to the layer's kernels).

Every way splits the sequence into 2·cp balanced chunks, two per rank. The rings run attention as cp calls of the
fused kernel per layer, 1/cp of the work each (compute.layer_time; the planner counts cp - 1 more kernels);
Ulysses (`a2a`) runs one call on 1/cp of the heads.

- `p2p`: Transformer Engine's ring (Megatron-Core's default cp_comm_type "p2p"; Liu et al. 2023, Ring
  Attention): cp - 1 steps, each sending this rank's K/V chunk on while attention runs on the one in hand,
  backward sending K, V and their gradients; each step shows only beyond that step's attention kernel.
- `all-gather`: shoal train's (shoal/parallel/context_parallel.py): the K/V at their own head count are
  all-gathered before attention runs, again in backward (nothing of the other ranks' is kept), and the
  keys' and values' gradients, fp32 and summed over the query heads, are reduce-scattered after it; each
  collective is waited for before the code goes on, so none hides.
- `torch-ring`: PyTorch's context_parallel as torchtitan ran it (its benchmark names torch 1963fc8, December
  2024; read here in pytorch 0123248a's torch/distributed/tensor/experimental/_attention.py and in torch 2.13's
  _context_parallel/_attention.py, which have the same ring, rotaters and merger; 1963fc8 itself was not read):
  `_cp_options.rotate_method` defaults to ALL_GATHER and torchtitan's `context_parallel_rotate_method`
  to "allgather" (torchtitan config_manager.py at 9dec370). `_templated_ring_attention` all-gathers the
  cat of K and V once, at the first of its cp SDPA calls, and waits for it at the second, so it shows
  beyond that first call; every later call's output is merged into an fp32 one by log-sum-exp
  (`_SDPAMerger`, convert_to_f32 True). Backward (`_templated_ring_attention_backward`) gathers K and V
  again the same way and passes the fp32 dK/dV around the ring (`dkv_rotater`, ALL_TO_ALL: one
  permute_tensor per call), each waited for after the next call's backward kernel, the last after the
  loop. The K/V it moves are those SDPA is given: torchtitan's Llama (models/llama/model.py at 9dec370)
  repeats the kv heads to the query heads (`repeat_kv`) before SDPA, so they are as wide as the queries.

- `a2a`: Ulysses (Jacobs et al. 2023, DeepSpeed-Ulysses; Megatron-Core's cp_comm_type "a2a", Transformer Engine's
  AttnFuncWithCPAndQKVOA2A in dot_product_attention/context_parallel.py, a 2025 version): instead of passing
  keys and values round, the ranks trade heads for sequence. Q, K and V are each all-to-all'ed before attention,
  which then runs once over the whole sequence on heads/cp heads, and the output is all-to-all'ed back; backward
  exchanges the output's gradient and then dQ, dK, dV the same way. Each exchange is waited for before
  attention (or the next layer) runs: none hides. Around each all-to-all flash_attn_a2a_communicate makes three
  copies of the tensor (the head split moved to the front, then after the exchange the sequence chunks put back
  in order: movedim().contiguous() and index_select), so each of the eight tensors is copied three times. Every
  rank must hold whole heads: the query and the key/value heads on a tensor-parallel rank must divide by cp.

A fully recomputed layer runs its forward again inside backward, exchange included (TE's and PyTorch's
rings and shoal's gather all live inside the checkpointed attention).
"""

from __future__ import annotations

from shoal.errors import UserError
from shoal.model.analytics import kv_heads_per_rank, kv_width
from shoal.model.config import ModelConfig
from shoal.planner import collectives as coll
from shoal.planner.collectives import overlap

A2A_COPIES = 3
"""Copies flash_attn_a2a_communicate makes of each tensor it exchanges (module docstring: `a2a`)."""

ATTENTION_BWD_RATIO = 2.5
"""Flash attention's backward against its forward (compute.py: it recomputes the scores)."""

FP32 = 4


def exchanged_width(cfg: ModelConfig, tp: int, cp_comm: str) -> float:
    """Elements per token of K (and of V) one rank exchanges: its kv heads (at least one per tp rank, as
    Megatron replicates them), or under `torch-ring` the query heads torchtitan's repeat_kv widened them to."""
    if cp_comm == "torch-ring":
        return cfg.n_heads * cfg.head_size / tp
    return kv_width(cfg) / min(tp, cfg.n_kv_heads)


def heads_problem(cfg: ModelConfig, tp: int, cp: int, cp_comm: str) -> UserError | None:
    """`a2a` splits each tensor-parallel rank's heads over the cp ranks: its query heads and its key/value heads
    must divide by cp (Transformer Engine asserts both). The other ways split the sequence and need nothing."""
    if cp_comm != "a2a" or cp <= 1:
        return None
    q_heads, kv_heads = cfg.n_heads // tp, kv_heads_per_rank(cfg, tp)
    if q_heads % cp == 0 and kv_heads % cp == 0:
        return None
    return UserError("--cp", cp, f"--cp-comm a2a gives each cp rank whole heads, and a tensor-parallel rank holds "
                               f"{q_heads} query and {kv_heads} key/value heads; use a cp that divides {kv_heads}, "
                               f"or another --cp-comm")


def ring_pass_bytes(cfg: ModelConfig, tokens: float, tp: int, cp: int, cp_comm: str, elem: int,
                    compiled: bool) -> tuple[float, float]:
    """(forward, backward) HBM bytes the way `cp_comm` adds to one layer's kernels on this rank's `tokens`
    beyond the attention calls themselves, counted op by op from the code in the module docstring (the
    busiest rank: the last, whose every call is a whole one). `compiled` (Workload.kernels fused:
    torchtitan compiles each block, its ring included): a merge step, an accumulation, a cast is one
    kernel, reading its inputs once and writing once; eager, every op is its own pass."""
    if cp <= 1:
        return 0.0, 0.0
    q = tokens * cfg.n_heads * cfg.head_size / tp  # elements of this rank's queries (and attention output)
    kv = tokens * exchanged_width(cfg, tp, cp_comm)  # elements of its K (and of its V)
    copy = 2 * elem  # read and write a 16-bit tensor
    if cp_comm == "a2a":  # Q, K, V and the output; backward their gradients; each copied A2A_COPIES times
        return (A2A_COPIES * copy * (2 * q + 2 * kv),) * 2
    if cp_comm == "p2p":
        # Transformer Engine (dot_product_attention/context_parallel.py at d0067d0d, AttnFuncWithCPAndKVP2P, 16-bit
        # without FP8): the first step's output scaled into `out` (flash_attn_fwd_out_correction_init), each later
        # one added in (out.add_, one jit-fused kernel: read both, write out); backward adds each step's dq into
        # its buffer and dk/dv into the one sent on (dq.add_, dk.add_), in the activations' dtype.
        add = 3 * elem
        return q * copy + (cp - 1) * q * add, cp * (q + 2 * kv) * add
    if cp_comm == "all-gather":
        # shoal (gather_kv, reduce_scatter_kv): the gathered K/V upcast to fp32, cat'ed in global order and
        # repeated to the query heads; the queries upcast, the output laid out [B, T, H, E] and cast back. Backward
        # gathers the same way, upcasts the queries and the output's gradient, zero-fills fp32 dq, dk, dv, sums
        # dk/dv over the repeated heads, re-orders them for the reduce-scatter and casts the three back.
        # (The fp32 chunk math between, which shoal runs on GPUs until its fused kernels are wired, is not counted.)
        gathered, widened = cp * 2 * kv, cp * 2 * q  # the whole sequence's K and V, at kv and at query width
        gather = gathered * (elem + FP32) + gathered * 2 * FP32 + (gathered + widened) * FP32
        fwd = gather + q * (elem + FP32) + q * 2 * FP32 + q * (FP32 + elem)
        bwd = (gather + 2 * q * (elem + FP32) + (q + widened) * FP32 + (widened + gathered) * FP32
               + gathered * 2 * FP32 + (q + 2 * kv) * (FP32 + elem))
        return fwd, bwd
    # torch-ring. Forward: K and V made contiguous and cat'ed for the all-gather; each call's output cast
    # to fp32 and merged into the running one (out - sigmoid(lse_b - lse)·(out - out_b): three passes of
    # fp32, eager); the merged output cast back.
    first_cast, last_cast = q * (elem + FP32), q * (FP32 + elem)
    if compiled:
        # the cats of later calls feed nothing (the all-gather rotater uses the first) and are dropped
        kv_copies = 2 * kv * copy
        merge = q * (elem + FP32 + FP32)  # read the call's output and the running one, write it
    else:
        kv_copies = 2 * kv * copy * cp  # .contiguous() once, the cat before every call but the last
        merge = q * (elem + FP32) + q * 3 * 3 * FP32  # the cast, then (out - out_b), ·sigmoid, out - that
    fwd = kv_copies + first_cast + (cp - 1) * merge + last_cast
    # Backward: fp32 accumulators for dq, dk, dv; each call's gradients added into them (dk/dv into the buffer
    # that came round the ring, re-assembled by _partial_update's cat), dk/dv cat'ed to be sent on; K and V
    # copied as in forward; at the end dq and the dk/dv that came back cast to 16 bits.
    add = elem + FP32 + FP32  # read the call's gradient and the accumulator, write it
    if compiled:
        per_call = q * add + 2 * kv * add  # the add writes straight into the buffer sent on
    else:
        per_call = q * add + 2 * kv * (add + 2 * FP32 + 2 * FP32)  # + the partial update's cat + the send's cat
    zeros = 0.0 if compiled else (q + 2 * kv) * FP32
    bwd = zeros + kv_copies + cp * per_call + (q + 2 * kv) * (FP32 + elem)
    return fwd, bwd


def exchange_time(k) -> tuple[float, float]:
    """(forward, backward) seconds of the K/V exchange on the critical path per layer, for timing._Kernels
    `k` (its layout, workload, network and attention kernel)."""
    lay, cfg, cp_comm = k.lay, k.cfg, k.workload.cp_comm
    if lay.cp <= 1:
        return 0.0, 0.0
    same_node = lay.rank_stride("cp") * lay.cp <= k.G
    kv = 2 * k.T * exchanged_width(cfg, lay.tp, cp_comm) * k.elem  # this rank's K and V, bytes
    step_fwd = k.attn_fwd / lay.cp  # one of the cp attention calls
    step_bwd = ATTENTION_BWD_RATIO * step_fwd
    hide = k.gpu.overlap_cost
    if cp_comm == "p2p":
        fwd = (lay.cp - 1) * overlap(coll.p2p(kv, same_node, k.net), step_fwd, hide)
        bwd = (lay.cp - 1) * overlap(coll.p2p(2 * kv, same_node, k.net), step_bwd, hide)
    elif cp_comm == "a2a":
        net = k.net.for_group(lay.cp, lay.rank_stride("cp"))
        per_node = max(1, min(lay.cp, k.G // lay.rank_stride("cp")))
        q = k.T * cfg.n_heads * cfg.head_size / lay.tp * k.elem  # this rank's queries (and output), bytes
        # Q, K, V in and the output back; backward the output's gradient in, dQ, dK, dV back: none beside compute
        fwd = bwd = 2 * coll.all_to_all(q, lay.cp, per_node, net) + coll.all_to_all(kv, lay.cp, per_node, net)
    else:
        net = k.net.for_group(lay.cp, lay.rank_stride("cp"))
        per_node = max(1, min(lay.cp, k.G // lay.rank_stride("cp")))
        gather = coll.all_gather(lay.cp * kv, lay.cp, per_node, net)
        if cp_comm == "all-gather":
            fwd = gather
            grads = lay.cp * kv * FP32 / k.elem  # the whole sequence's dK/dV in fp32, reduce-scattered
            bwd = gather + coll.reduce_scatter(grads, lay.cp, per_node, net)
        else:  # torch-ring
            fwd = overlap(gather, step_fwd, hide)
            send = coll.p2p(kv * FP32 / k.elem, same_node, k.net)  # one rank's dK/dV, fp32
            bwd = overlap(gather, step_bwd, hide) + (lay.cp - 1) * overlap(send, step_bwd, hide) + send
    if lay.activation_checkpoint == "full":
        bwd += fwd
    return fwd, bwd


def buffer_bytes(cfg: ModelConfig, tokens: float, tp: int, cp: int, cp_comm: str, elem: int) -> float:
    """Bytes the exchange holds at its peak inside one layer's attention (memory.py's transient buffers), the
    larger of forward and backward. `p2p`: the K/V chunk being received beside the one in use (dK/dV in
    backward). `torch-ring`: backward's gathered K/V of every rank, the fp32 dq, dk and dv accumulators, the
    fp32 dK/dV received and the one sent on. `all-gather` (shoal): backward's whole-sequence K/V repeated to the
    query heads in fp32, their fp32 gradients, and the gathered 16-bit K/V they came from."""
    if cp <= 1:
        return 0.0
    q = tokens * cfg.n_heads * cfg.head_size / tp
    kv = tokens * exchanged_width(cfg, tp, cp_comm)
    if cp_comm == "p2p":
        return 2 * 2 * kv * elem
    if cp_comm == "a2a":  # Q, K and V copied for the exchange, and again as its output is put in order
        return 2 * (q + 2 * kv) * elem
    if cp_comm == "torch-ring":
        return cp * 2 * kv * elem + (q + 2 * kv) * FP32 + 2 * 2 * kv * FP32
    return cp * 2 * kv * elem + 2 * (cp * 2 * q) * FP32 + q * FP32
