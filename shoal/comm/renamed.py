"""What torch 2.13 renamed, for shoal to run on either side of it without warnings or errors
(GPU images still ship 2.11):

- two collectives, whose old names now warn (FutureWarning) on every call: all_gather_into_tensor
  -> all_gather_single, reduce_scatter_tensor -> reduce_scatter_single. Everything in shoal calls
  them through here. The name is looked up at each call, not at import: patch.py swaps these
  functions on torch.distributed while a counter or the debug monitor watches.
- DistributedDataParallel's broadcast_buffers -> forward_sync_buffers (the new name is a TypeError
  before 2.13; the old one warns after)."""

from __future__ import annotations

import inspect

import torch.distributed as dist


def all_gather_single(output, input, **kwargs):
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(output, input, **kwargs)


def reduce_scatter_single(output, input, **kwargs):
    return (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(output, input, **kwargs)


def ddp_without_buffer_sync() -> dict:
    """DistributedDataParallel's keyword for "do not broadcast buffers before each forward"."""
    from torch.nn.parallel import DistributedDataParallel

    new = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if new else {"broadcast_buffers": False}
