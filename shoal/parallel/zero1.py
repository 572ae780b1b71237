"""ZeRO-1: each data-parallel rank keeps AdamW state for its share of the parameters only.

Gradients are all-reduced as under zero=0 (DDP or FSDP2's `replicate`), so every rank holds all of
them; each rank steps the parameters it owns and broadcasts the results to the other ranks of
its data-parallel group. torch's ZeroRedundancyOptimizer does the same for plain tensors, but its
broadcast has no DTensor rule, so it cannot run under tensor parallelism or on `replicate`d
pipeline stages; this works on the local tensor of a DTensor, which is what the data-parallel
peers share.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def owners(params: list[torch.Tensor], n_ranks: int) -> list[int]:
    """Which data-parallel rank steps each parameter: largest first onto the least-loaded rank.
    Every rank computes the same answer from the same parameter list."""
    load, owner = [0] * n_ranks, [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: -_local(params[i]).numel()):
        owner[i] = load.index(min(load))
        load[owner[i]] += _local(params[i]).numel()
    return owner


class ShardedAdamW:
    """AdamW over this rank's share of the parameters, then a broadcast of every updated share.

    Looks like an optimizer to the trainer (step, zero_grad, param_groups, state); `optim` is the
    inner AdamW holding this rank's parameters (the checkpoint saves its state by name).
    """

    def __init__(self, groups: list[dict], group: dist.ProcessGroup, **adamw_kwargs):
        self.group, rank = group, dist.get_rank(group)
        self.params = [p for g in groups for p in g["params"]]
        owner = owners(self.params, dist.get_world_size(group))
        self.src = [dist.get_global_rank(group, r) for r in owner]
        mine = {id(p) for p, r in zip(self.params, owner) if r == rank}
        self.optim = torch.optim.AdamW([{**g, "params": [p for p in g["params"] if id(p) in mine]} for g in groups],
                                       **adamw_kwargs)

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    @torch.no_grad()
    def step(self) -> None:
        self.optim.step()
        works = [dist.broadcast(_local(p), src=src, group=self.group, async_op=True)
                 for p, src in zip(self.params, self.src)]
        for work in works:
            work.wait()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:  # every rank holds every gradient, owned or not
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
