"""Pipeline parallelism with torch.distributed.pipelining.

A stage is the model itself with the layers it does not own deleted, so it keeps the original
parameter names (`layers.7.attention.wq.weight` on whichever rank holds layer 7). The first stage
keeps the embedding, the last keeps the final norm and output head; the others have them as None.
"""

from __future__ import annotations

import copy

from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

SCHEDULE_CLASSES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "zero-bubble": ScheduleInterleavedZeroBubble,
}


def layer_split(n_layers: int, n_stages: int, lighter_edges: int = 0) -> list[range]:
    """Contiguous layer ranges per stage, balanced by count.

    lighter_edges moves that many layers off each of the first and last stages (which also run
    the embedding and the output head) onto the middle ones.
    """
    weights = [1.0] * n_stages
    if n_stages > 2 and lighter_edges:
        per_stage = n_layers / n_stages
        shift = min(lighter_edges, per_stage - 1) / per_stage if per_stage > 1 else 0
        weights[0] = weights[-1] = 1 - shift
        for i in range(1, n_stages - 1):
            weights[i] = 1 + 2 * shift / (n_stages - 2)
    total, bounds, acc = sum(weights), [0], 0.0
    for w in weights[:-1]:
        acc += w
        bounds.append(round(acc / total * n_layers))
    bounds.append(n_layers)
    return [range(bounds[i], bounds[i + 1]) for i in range(n_stages)]


def stage_indices(pp_rank: int, pp: int, n_virtual: int) -> list[int]:
    """Which global stages this pipeline rank runs: pp_rank, pp_rank + pp, ... (a loop)."""
    return [pp_rank + v * pp for v in range(n_virtual)]


def cut_stage(model: nn.Module, stage: int, n_stages: int, layers: range) -> nn.Module:
    part = copy.deepcopy(model)
    for name in list(part.layers):
        if int(name) not in layers:
            del part.layers[name]
    if stage != 0:
        part.tok_embeddings = None
    if stage != n_stages - 1:
        part.norm = None
        part.output = None
    return part


def split_model(model: nn.Module, pp_rank: int, pp: int, n_virtual: int, schedule: str,
                lighter_edges: int = 0) -> tuple[list[int], list[nn.Module]]:
    n_stages = pp * n_virtual
    split = layer_split(model.cfg.n_layers, n_stages, lighter_edges)
    ids = stage_indices(pp_rank, pp, n_virtual)
    return ids, [cut_stage(model, i, n_stages, split[i]) for i in ids]


def build_schedule(modules: list[nn.Module], ids: list[int], n_stages: int, n_microbatches: int,
                   loss_fn, schedule: str, device, pp_group):
    stages = [PipelineStage(m, i, n_stages, device, group=pp_group) for m, i in zip(modules, ids)]
    cls = SCHEDULE_CLASSES[schedule]
    # scale_grads: the schedule divides gradients by n_microbatches, so they are a mean like the loss.
    if len(stages) == 1:
        return cls(stages[0], n_microbatches, loss_fn=loss_fn, scale_grads=True)
    return cls(stages, n_microbatches, loss_fn=loss_fn, scale_grads=True)
