"""Counting the bytes this rank hands to collectives, per kind, without touching the call sites.

A TorchDispatchMode sees every c10d and functional-collective op that goes through the
dispatcher: FSDP2's all-gathers and reduce-scatters, DTensor's tensor-parallel collectives, the
expert all-to-alls and the pipeline's send/recv. The count is the payload this rank contributes
(the input buffer: what nccl-tests calls the per-rank bytes of all_gather), not the bytes a ring
algorithm puts on the wire, which is about 2(n-1)/n times the payload for an all-reduce.
DDP's bucketed all-reduce (zero=1) is issued from C++ outside the mode and counted by its hook.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# op name -> (kind, index of the argument holding what this rank sends)
_COLLECTIVES = {
    "c10d::allreduce_": ("all_reduce", 0),
    "c10d::allreduce_coalesced_": ("all_reduce", 0),
    "c10d::_allgather_base_": ("all_gather", 1),
    "c10d::allgather_": ("all_gather", 1),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", 1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1),
    "c10d::reduce_scatter_": ("reduce_scatter", 1),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "c10d::alltoall_base_": ("all_to_all", 1),
    "c10d::alltoall_": ("all_to_all", 1),
    "c10d::broadcast_": ("broadcast", 0),
    "c10d::send": ("send", 0),
    "_c10d_functional::all_reduce": ("all_reduce", 0),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", 0),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", 0),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", 0),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", 0),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "_c10d_functional::all_to_all_single": ("all_to_all", 0),
    "_c10d_functional::isend": ("send", 0),
    "_c10d_functional_autograd::all_to_all_single": ("all_to_all", 0),
    "_c10d_functional_autograd::all_gather_into_tensor": ("all_gather", 0),
    "_c10d_functional_autograd::reduce_scatter_tensor": ("reduce_scatter", 0),
}


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


class CommCounter(TorchDispatchMode):
    """with CommCounter() as c: ...; c.bytes -> {"all_gather": n, ...}"""

    def __init__(self):
        super().__init__()
        self.bytes: Counter[str] = Counter()

    def add(self, kind: str, nbytes: int) -> None:
        self.bytes[kind] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = _COLLECTIVES.get(func._schema.name)
        if kind is not None:
            self.bytes[kind[0]] += _nbytes(args[kind[1]])
        return func(*args, **(kwargs or {}))


def ddp_counting_hook(counter_ref):
    """A DDP comm hook that counts each bucket and then all-reduces it as DDP would (averaging)."""
    import torch.distributed as dist

    def hook(process_group, bucket):
        counter = counter_ref()
        if counter is not None:
            counter.add("all_reduce", _nbytes(bucket.buffer()))
        group = process_group or dist.group.WORLD
        tensor = bucket.buffer().div_(dist.get_world_size(group))
        return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda f: f.value()[0])

    return hook


def model_state_bytes(params, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank actually holds (local shards)."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    total = 0
    for p in params:
        total += _nbytes(local(p))
        if p.grad is not None:
            total += _nbytes(local(p.grad))
    opt = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard's state inside
    for state in opt.state.values():
        total += sum(_nbytes(local(v)) for v in state.values() if isinstance(v, torch.Tensor) and v.ndim > 0)
    return total
