"""torch 2.13 renamed two collectives, and the old names now warn (FutureWarning) on every call:
all_gather_into_tensor -> all_gather_single, reduce_scatter_tensor -> reduce_scatter_single.
Everything in shoal calls them through here, so a torch of either age works without the warning.
The name is looked up at each call, not at import: patch.py swaps these functions on
torch.distributed while a counter or the debug monitor watches."""

from __future__ import annotations

import torch.distributed as dist


def all_gather_single(output, input, **kwargs):
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, input, **kwargs)


def reduce_scatter_single(output, input, **kwargs):
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(output, input, **kwargs)
