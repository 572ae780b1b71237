"""Counting the bytes this rank sends in collectives, per kind, without touching the call sites.

Every collective shoal's layouts issue reaches C++ through one of two Python doors, and CommCounter
wraps both for the duration of a step:
* ProcessGroup methods: the c10d API (dist.all_reduce, all_gather_into_tensor, ...), hence FSDP2's
  all-gathers and reduce-scatters, DDP's all-reduce (through its Python comm hook, see
  data_parallel.apply_ddp), the pipeline's send/recv and ZeRO-1's broadcast.
* Functional collectives (`torch.ops._c10d_functional.*`), which DTensor's tensor parallelism and
  the expert all-to-alls call, including in their (Python) backward formulas.
A TorchDispatchMode would see the same ops but puts every aten op of the step through Python:
5% of a tiny model's step on CPU (bench/bench_vs_plain.py). tests/dist/test_comm_counter.py keeps
such a mode as the reference the two doors are checked against.

Each call is converted to the bytes one rank puts on the wire under the ring algorithms nccl-tests
assumes, for a group of n ranks and a buffer of S bytes: all_reduce 2(n-1)/n·S, all_gather
(n-1)/n·S_out, reduce_scatter (n-1)/n·S_in, all_to_all S_in minus the rank's own chunk, broadcast
(n-1)/n·S (a chain: every rank but the last forwards S), send S.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist

# ProcessGroup method -> (kind, index of the argument holding what this rank contributes)
PG_METHODS = {
    "allreduce": ("all_reduce", 0), "allreduce_coalesced": ("all_reduce", 0),
    "all_gather_single": ("all_gather", 1), "all_gather_single_coalesced": ("all_gather", 1),
    "_allgather_base": ("all_gather", 1), "allgather": ("all_gather", 1),
    "allgather_into_tensor_coalesced": ("all_gather", 1),
    "reduce_scatter_single": ("reduce_scatter", 1), "reduce_scatter_single_coalesced": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter", 1), "reduce_scatter": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 1),
    "all_to_all_single": ("all_to_all", 1), "alltoall_base": ("all_to_all", 1),
    "broadcast": ("broadcast", 0), "send": ("send", 0),
}
# functional collective -> (kind, index of the payload argument); the group name is the last argument
FUNCTIONAL = {
    "all_reduce": ("all_reduce", 0), "all_reduce_": ("all_reduce", 0), "all_reduce_coalesced": ("all_reduce", 0),
    "all_gather_into_tensor": ("all_gather", 0), "all_gather_into_tensor_coalesced": ("all_gather", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 0), "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "all_to_all_single": ("all_to_all", 0), "broadcast": ("broadcast", 0), "isend": ("send", 0),
}
# all_to_all: index of the argument with this rank's input split sizes (None or empty: even splits)
INPUT_SPLITS = {"all_to_all_single": 3, "alltoall_base": 3}
FUNCTIONAL_INPUT_SPLITS = 2


def nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(nbytes(t) for t in x)
    return 0


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


def own_chunk(payload: int, splits, rank: int, n: int) -> int:
    """The part of an all-to-all's input a rank sends itself (it never leaves the rank)."""
    splits = list(splits or [])
    return payload * splits[rank] // sum(splits) if splits and sum(splits) else payload // n


class CommCounter:
    """with CommCounter() as c: ...; c.bytes -> {"all_gather": n, ...} (bytes this rank sent)."""

    def __init__(self):
        self.bytes: Counter[str] = Counter()
        self._undo: list[tuple[object, str, object]] = []

    def add(self, kind: str, payload: int, n: int, rank: int, splits=None) -> None:
        own = own_chunk(payload, splits, rank, n) if kind == "all_to_all" else None
        self.bytes[kind] += int(wire_bytes(kind, payload, n, own))

    def __enter__(self) -> CommCounter:
        for name, spec in PG_METHODS.items():
            self._wrap(dist.ProcessGroup, name, self._pg_method(name, *spec))
        for name, spec in FUNCTIONAL.items():
            self._wrap(torch.ops._c10d_functional, name, self._functional(name, *spec))
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            obj, name, original = self._undo.pop()
            setattr(obj, name, original)

    def _wrap(self, obj, name: str, make) -> None:
        # The raw class attribute: getattr() on a pybind11 class returns an unbound function, and
        # putting that back would lose the method binding.
        original = vars(obj)[name] if name in vars(obj) else getattr(obj, name)
        self._undo.append((obj, name, original))
        setattr(obj, name, make(getattr(obj, name)))

    def _pg_method(self, name: str, kind: str, index: int):
        splits_at = INPUT_SPLITS.get(name)

        def make(original):
            def counted(pg, *args, **kwargs):
                splits = args[splits_at] if splits_at is not None and len(args) > splits_at else None
                self.add(kind, nbytes(args[index]), pg.size(), pg.rank(), splits)
                return original(pg, *args, **kwargs)
            return counted
        return make

    def _functional(self, name: str, kind: str, index: int):
        def make(packet):
            return _CountedOp(packet, lambda args, kwargs: self._count_functional(kind, index, args, kwargs))
        return make

    def _count_functional(self, kind: str, index: int, args, kwargs) -> None:
        from torch.distributed.distributed_c10d import _resolve_process_group

        pg = _resolve_process_group(kwargs.get("group_name", args[-1]))
        splits = args[FUNCTIONAL_INPUT_SPLITS] if kind == "all_to_all" else None
        self.add(kind, nbytes(args[index]), pg.size(), pg.rank(), splits)


class _CountedOp:
    """Stands in for an op packet (torch.ops._c10d_functional.X): counts calls, delegates the rest."""

    def __init__(self, packet, count):
        self._packet, self._count = packet, count

    def __call__(self, *args, **kwargs):
        self._count(args, kwargs)
        return self._packet(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._packet, name)


def model_state_bytes(params, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank actually holds (local shards)."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    total = 0
    for p in params:
        total += nbytes(local(p))
        if p.grad is not None:
            total += nbytes(local(p.grad))
    for state in optimizer.state.values():  # under zero=1 only this rank's share has state
        total += sum(nbytes(local(v)) for v in state.values() if isinstance(v, torch.Tensor) and v.ndim > 0)
    return total
