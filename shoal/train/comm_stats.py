"""Counting the bytes this rank sends in collectives, per kind, without touching the call sites.

A TorchDispatchMode sees every c10d and functional-collective op that goes through the
dispatcher: FSDP2's all-gathers and reduce-scatters, DDP's bucketed all-reduce (its C++ reducer
calls the same ops), DTensor's tensor-parallel collectives, the expert all-to-alls and the
pipeline's send/recv. Each is converted to the bytes one rank puts on
the wire under the ring algorithms nccl-tests assumes, for a group of n ranks and a buffer of S
bytes: all_reduce 2(n-1)/n·S, all_gather (n-1)/n·S_out, reduce_scatter (n-1)/n·S_in,
all_to_all S_in minus the rank's own chunk, broadcast (n-1)/n·S (a chain: every rank but the last
forwards S), send S.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# op name -> (kind, index of the argument holding what this rank contributes)
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

# all_to_all ops: index of the argument with this rank's input split sizes (empty: even splits)
_INPUT_SPLITS = {"c10d::alltoall_base_": 4, "_c10d_functional::all_to_all_single": 2,
                 "_c10d_functional_autograd::all_to_all_single": 2}


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _group(args) -> tuple[int, int]:
    """(size, my rank) of the process group an op runs on: a ProcessGroup object or a group name."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject) and a._type().qualified_name().endswith("c10d.ProcessGroup"):
            pg = torch.distributed.ProcessGroup.unbox(a)  # ops receive the group boxed as a TorchScript object
            return pg.size(), pg.rank()
        if isinstance(a, str):
            try:
                pg = _resolve_process_group(a)
            except (ValueError, RuntimeError, KeyError):
                continue
            return pg.size(), pg.rank()
    return 1, 0


def wire_bytes(kind: str, payload: int, n: int, own_chunk: int | None = None) -> float:
    """Bytes one rank sends for a collective over n ranks, by the ring formulas above.

    payload is the buffer this rank contributes (for all_gather: its input, a 1/n share of the output).
    """
    from shoal.debug.busbw import bus_factor  # nccl-tests' factors, one place for them

    if n <= 1:
        return 0.0
    if kind in ("all_reduce", "reduce_scatter"):
        return bus_factor(kind, n) * payload
    if kind == "all_gather":
        return bus_factor(kind, n) * payload * n  # of the n-times-larger output
    if kind == "broadcast":
        return (n - 1) / n * payload
    if kind == "all_to_all":
        return payload - own_chunk if own_chunk is not None else (n - 1) / n * payload
    return float(payload)  # send


class CommCounter(TorchDispatchMode):
    """with CommCounter() as c: ...; c.bytes -> {"all_gather": n, ...} (bytes this rank sent)."""

    def __init__(self):
        super().__init__()
        self.bytes: Counter[str] = Counter()

    def add(self, kind: str, nbytes: float) -> None:
        self.bytes[kind] += int(nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        spec = _COLLECTIVES.get(func._schema.name)
        if spec is not None:
            kind, index = spec
            n, rank = _group(args)
            payload = _nbytes(args[index])
            own = None
            if kind == "all_to_all":  # the chunk a rank sends itself never leaves it
                splits = args[_INPUT_SPLITS[func._schema.name]]
                own = payload * splits[rank] // sum(splits) if splits and sum(splits) else payload // n
            self.add(kind, wire_bytes(kind, payload, n, own))
        return func(*args, **(kwargs or {}))


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
