"""What a pipeline schedule costs beyond its micro-batches: the bubble, and for DualPipe which chunks run paired.

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
