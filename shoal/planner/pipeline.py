"""What a pipeline schedule costs beyond its micro-batches: the bubble, and for DualPipe which chunks run paired;
and what it holds: the layers of each stage, and how many micro-batches of them a rank keeps in flight at its peak
(memory.py multiplies them by the bytes of one layer's activations).

Bubbles, in the notation of DeepSeek-V3's Table 2 (arXiv:2412.19437 §3.2.1): F and B one micro-batch's forward
and full backward on the busiest rank, W the weight-gradient part of B, F&B a forward and a backward chunk run
as one overlapped pair.

    gpipe, 1f1b           (p-1)(F+B)               Narayanan et al. 2021 §2.2.1
    interleaved-1f1b      (p-1)(F+B)/v             Narayanan et al. 2021 §2.2.2
    zero-bubble           (p-1)(F+B)/(3v)          ZB-H1 leaves about a third of 1F1B's (Qi et al., ICLR 2024,
                                                   Table 3 / Fig. 4)
    dualpipe              (p/2-1)(F&B+B-3W)        DeepSeek-V3 Table 2; deepseek-ai/DualPipe README

DualPipe (deepseek-ai/DualPipe, dualpipe.py `step`): rank i holds stages i and p-1-i; half the m micro-batches
enter at rank 0, half at rank p-1. Rank r (h = min(r, p-1-r)) warms up with 2(p/2-h-1) forwards of its first
chunk and h+1 forward pairs, runs zero-bubble B/W/F steps, then the steady state of F&B pairs: m/2-p+h+1
iterations of two pairs, then p/2-h-1 more pairs. Rank 0 (h = 0) pairs the fewest: m - 3p/2 + 1 of its m
forward and m backward chunks. A pair hides each chunk's all-to-all and pipeline sends behind the other chunk's
kernels (§3.2.1, Figure 4); the chunks outside the pairs pay them in full.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import accumulate

from shoal.layout import INTERLEAVED
from shoal.model.config import ModelConfig


def bubble(schedule: str, pp: int, virtual: int, t_f: float, t_b: float, w: float) -> float:
    """Seconds of pipeline fill and drain on the busiest rank (module docstring's table). t_f, t_b: one
    micro-batch's forward and backward there, collectives included; w: the weight-gradient kernels of t_b."""
    if pp == 1:
        return 0.0
    if schedule == "dualpipe":
        # F&B is t_f + t_b: the pair runs both chunks' kernels back to back on the SMs it leaves to compute;
        # what it hides (all-to-all, sends) is already out of the paired t_f and t_b (timing._ep_comm).
        return (pp / 2 - 1) * ((t_f + t_b) + t_b - 3 * w)
    bubble_mbs = (pp - 1) / virtual
    if schedule == "zero-bubble":
        bubble_mbs /= 3
    return bubble_mbs * (t_f + t_b)


def dualpipe_paired_share(pp: int, microbatches: int) -> float:
    """The share of rank 0's forward (and of its backward) chunks that run in an overlapped F&B pair: the
    rank that pairs the fewest (module docstring), so the one whose all-to-all shows most."""
    return max(0.0, microbatches - 3 * pp / 2 + 1) / microbatches


DUALPIPE_HEAD_SHARE = 0.5
"""The share of micro-batches the busiest DualPipe rank runs the output head for. Rank 0 holds the first and the
last stage (DeepSeek-V3 §3.2.3: the shallowest layers with the embedding and the deepest with the output head on
one PP rank) and runs the head for the micro-batches entering at rank p-1: half of them. The middle ranks hold
full-sized stages and no head; the busiest is taken as a full stage plus half the head, above both."""

DUALPIPE_STAGE_COPIES = 2
"""Pipeline ranks holding each stage under DualPipe (Table 2: 2x parameters per device): ZeRO shards a stage's
state over the data-parallel ranks of both, and gradients are summed over them (deepseek-ai/DualPipe's example
adds the two copies' gradients after the step)."""


def stage_copies(schedule: str) -> int:
    return DUALPIPE_STAGE_COPIES if schedule == "dualpipe" else 1


@lru_cache(maxsize=4096)
def stage_layers(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Layers of each pipeline stage, as a tuned run splits them: ceil(L/S) each, and the stages that
    must take one fewer are the edges first (first, last, second, second-to-last, ...), which also run
    the embedding and the head. Llama 3 405B does exactly this (126 layers, "one Transformer layer less"
    on the first and last stages, §3.3.2), as Megatron's --decoder-first/last-pipeline-num-layers and
    --account-for-embedding-in-pipeline-split do. Up to two stages more than layers leaves the edge
    stages with only the embedding and the head."""
    c = -(-n_layers // n_stages)
    counts = [c] * n_stages
    edges = [i for pair in zip(range(n_stages), range(n_stages - 1, -1, -1)) for i in pair]
    for i in list(dict.fromkeys(edges))[:n_stages * c - n_layers]:
        counts[i] -= 1
    return tuple(counts)


@lru_cache(maxsize=4096)
def rank_stage_layer_ids(n_layers: int, pp: int, virtual: int, stage: str) -> tuple[range, ...]:
    """The layer indices of each stage the first or last pipeline rank runs, in its chunk order."""
    if pp == 1:
        return (range(n_layers),)
    counts = stage_layers(n_layers, pp * virtual)
    starts = list(accumulate(counts, initial=0))
    rank = 0 if stage == "first" else pp - 1
    return tuple(range(starts[s], starts[s + 1]) for s in (rank + c * pp for c in range(virtual)))


@lru_cache(maxsize=16384)
def inflight_layer_microbatches(n_layers: int, pp: int, virtual: int, schedule: str, microbatches: int) -> tuple[float, float]:
    """(first stage, last stage) count of layer x micro-batch activations held at the peak (inflight_chunks)."""
    return tuple(float(sum(len(chunk) * n for chunk, n in side))
                 for side in inflight_chunks(n_layers, pp, virtual, schedule, microbatches))


@lru_cache(maxsize=16384)
def inflight_chunks(n_layers: int, pp: int, virtual: int, schedule: str, microbatches: int):
    """(first rank, last rank): each stage the rank runs (its layer indices) and how many micro-batches of it
    the rank holds at its peak.

    1F1B: stage 0 runs p forwards before its first backward, so it holds min(p, m) micro-batches of
    its layers — about L layers' worth (Korthikanti Eq. 5); the last stage holds one. Interleaved
    (Megatron's schedule, Narayanan §2.2.2): rank 0 runs its chunks in turn, p micro-batches each, and
    warms up 2(p-1) + (v-1)p chunk-micro-batches before its first backward, plus the one in flight:
    L·(1 + (p-1)/(p·v)) layers when every chunk is as large, fewer when its first chunk is the light one
    (stage_layers). The last rank warms up (v-1)p. GPipe holds all m on every stage. Zero-bubble is
    interleaved too; its deferred weight gradients hold no activations (only the inputs' gradients,
    freed by then), so the same count. DualPipe: rank 0 holds the first and the last stage; it runs
    2(p/2-1) + 1 forwards of the first and one of the last before its first backward, then one more
    forward: p micro-batches of the first stage and one of the last, PP+1 chunks (DeepSeek-V3 Table 2;
    deepseek-ai/DualPipe's schedule, planner/pipeline.py). Both sides are that rank's (p-1 mirrors it).
    """
    m = microbatches
    first, last = (rank_stage_layer_ids(n_layers, pp, virtual, s) for s in ("first", "last"))
    if pp == 1:
        return ((first[0], 1),), ((first[0], 1),)
    if schedule == "dualpipe":
        edges = ((first[0], pp), (last[0], 1))
        return edges, edges
    if schedule == "gpipe":
        return tuple((c, m) for c in first), tuple((c, m) for c in last)
    if schedule in INTERLEAVED:
        def held(chunks: tuple[range, ...], warmup: int) -> tuple[tuple[range, int], ...]:
            n = min(m * virtual, warmup + 1)  # chunk-micro-batches in flight
            rounds, rest = divmod(n, pp * virtual)
            out = []
            for c in chunks:  # the unfinished round: p micro-batches of each chunk in turn
                take = min(pp, rest)
                out.append((c, rounds * pp + take))
                rest -= take
            return tuple(out)
        return held(first, 2 * (pp - 1) + (virtual - 1) * pp), held(last, (virtual - 1) * pp)
    return ((first[0], min(pp, m)),), ((last[0], 1),)


@lru_cache(maxsize=16384)
def held_layer_microbatches(cfg: ModelConfig, pp: int, virtual: int, schedule: str, microbatches: int):
    """(first rank, last rank): the (dense, MoE) layer x micro-batch pairs each holds at its peak (inflight_chunks).
    Each layer counts as its own kind: a stage of DeepSeek-V3's three dense layers keeps less than one of MoE layers."""
    def kinds(side) -> tuple[float, float]:
        moe = sum(n * sum(cfg.is_moe_layer(i) for i in chunk) for chunk, n in side)
        return float(sum(n * len(chunk) for chunk, n in side) - moe), float(moe)
    return tuple(kinds(side) for side in inflight_chunks(cfg.n_layers, pp, virtual, schedule, microbatches))
