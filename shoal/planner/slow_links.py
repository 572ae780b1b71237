"""How gradient compression and DiLoCo change the data-parallel communication term (torch-free).

Bytes per rank per step against the fp32 ring all-reduce of the gradients, 2(p-1)/p * 4n
(../shared/reference/compression.md has the sources; parallel/compression.py and diloco.py run them):

    bf16       1/2
    int8       (1 + 4/256) / 4: int8 values out and back, one fp32 scale per 256 values
    fp4        (1/2 + 4/256) / 4: the same with two 4-bit values to a byte (DiLoCo's pseudo-gradient only)
    topk       p * density: values and int32 indices all-gathered, (p-1) d n 8 bytes; the saving
               shrinks as p grows and is a loss past p = 1/density
    powersgd   sum (m+k) r / sum m k over the weight matrices (vectors are negligible)
    DiLoCo     the parameters' all-reduce (fp32, or bf16/int8 as above) once every H steps, waited
               for at the end of the step (timing.py). Streaming fragments lower the peak per step,
               not the mean, and shoal's trainer applies each fragment in the step it was sent, so
               the planner does not hide them behind compute.

Memory: top-k and PowerSGD keep an fp32 error-feedback residual the size of the gradient a rank
reduces; DiLoCo keeps an fp32 outer copy of the rank's parameters and its momentum (memory.py adds
both to the optimizer state).

The time model takes the same collective with its bytes scaled by the factor: latency terms stay,
so a tiny model gains less than the factor says, as it does on a real network.
"""

from __future__ import annotations

from shoal.model.config import ModelConfig

QUANTIZED = {"none": 1.0, "bf16": 0.5, "int8": (1 + 4 / 256) / 4, "fp4": (0.5 + 4 / 256) / 4}
"""Bytes on the wire per fp32 byte, for the pseudo-gradient (parallel.diloco_quantize) and the
same casts of gradients."""


def weight_matrices(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(m, k) of each weight matrix PowerSGD compresses: per layer attention and feed-forward, and
    the embedding and output head."""
    q, kv = cfg.n_heads * cfg.head_size, cfg.n_kv_heads * cfg.head_size
    ffn = [(cfg.ffn_hidden, cfg.dim), (cfg.ffn_hidden, cfg.dim), (cfg.dim, cfg.ffn_hidden)]
    layer = [(q, cfg.dim), (kv, cfg.dim), (kv, cfg.dim), (cfg.dim, q)] + ffn
    return layer * cfg.n_layers + [(cfg.vocab_size, cfg.dim)] * 2


def grad_wire_factor(method: str, dp: int, cfg: ModelConfig, density: float = 0.1, rank: int = 4) -> float:
    """Gradient bytes on the wire per rank per step, as a share of the fp32 ring all-reduce's."""
    if method in QUANTIZED:
        return QUANTIZED[method]
    if method == "topk":
        return dp * density
    if method == "powersgd":
        mats = weight_matrices(cfg)
        return sum((m + k) * min(rank, m, k) for m, k in mats) / sum(m * k for m, k in mats)
    raise ValueError(method)


def extra_state_bytes(workload, params: float, grads_per_rank: float) -> float:
    """Bytes a rank holds beyond the optimizer's own state for its slow-link method, given the
    parameters it holds and the gradient elements it reduces (parallel/compression.py's `error`,
    parallel/diloco.py's `outer` and `buf`, all fp32)."""
    extra = 4.0 * grads_per_rank if workload.grad_compression in ("topk", "powersgd") else 0.0
    return extra + (8.0 * params if workload.diloco_inner_steps else 0.0)


def slow_link_fields(parallel: dict) -> dict:
    """The Workload fields a run's `parallel` config section sets (validate and report plan its run)."""
    names = ("grad_compression", "topk_density", "powersgd_rank", "diloco_inner_steps", "diloco_quantize",
             "diloco_overlap_steps")
    return {k: parallel[k] for k in names if k in parallel}
