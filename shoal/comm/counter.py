"""Counting the bytes this rank sends in collectives, per kind, without touching the call sites.

CommCounter is an observer of the patch layer (patch.py) at two doors, for the duration of a step:
* "pg", ProcessGroup methods: the c10d API, hence FSDP2's all-gathers and reduce-scatters, DDP's
  all-reduce (through its Python comm hook, see data_parallel.apply_ddp), the pipeline's send/recv
  and ZeRO-1's broadcast;
* "op", the functional-collective op packets (`torch.ops._c10d_functional.*`), which DTensor's
  tensor parallelism and the expert all-to-alls call, including in their (Python) backward formulas.
tests/dist/test_comm_counter.py checks both against a TorchDispatchMode that sees every op (too
slow to leave on). Each call becomes the bytes one rank puts on the wire under the ring
algorithms nccl-tests assumes (ops.wire_bytes).
"""

from __future__ import annotations

from collections import Counter

import torch

from shoal.comm import ops, patch


def nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(nbytes(t) for t in x)
    return 0


def dtype_name(x) -> str:
    """The element type a payload goes on the wire in: "float32", "bfloat16", "int8", ..."""
    while isinstance(x, (list, tuple)) and x:
        x = x[0]
    return str(x.dtype).removeprefix("torch.") if isinstance(x, torch.Tensor) else "?"


class CommCounter(patch.Observer):
    """with CommCounter() as c: ...; c.bytes -> {"all_gather": n, ...} (bytes this rank sent);
    c.by_dtype -> {"all_gather:bfloat16": n, ...}, the same bytes split by the dtype actually sent;
    c.by_dim -> {"all_gather:dp_shard": n, ...}, split by the parallel dimension whose group carried
    them, from `labels` (process-group name -> dimension; groups not in it count as "other")."""

    doors = ("pg", "op")

    def __init__(self, labels: dict[str, str] | None = None):
        self.labels = labels or {}
        self.bytes: Counter[str] = Counter()
        self.by_dtype: Counter[str] = Counter()
        self.by_dim: Counter[str] = Counter()

    def reset(self) -> None:
        self.bytes.clear()
        self.by_dtype.clear()
        self.by_dim.clear()

    def __enter__(self) -> CommCounter:
        patch.attach(self)
        return self

    def __exit__(self, *exc) -> None:
        patch.detach(self)

    def add(self, kind: str, payload: int, n: int, rank: int, splits=None, dtype: str = "?", group: str = "") -> None:
        own = ops.own_chunk(payload, splits, rank, n) if kind == "all_to_all" else None
        sent = int(ops.wire_bytes(kind, payload, n, own))
        self.bytes[kind] += sent
        self.by_dtype[f"{kind}:{dtype}"] += sent
        self.by_dim[f"{kind}:{self.labels.get(group, 'other')}"] += sent

    def before(self, door, name, target, args, kwargs):
        if door == "pg":
            m = ops.PG_METHODS[name]
            if m.payload is not None:
                splits = args[m.splits] if m.splits is not None and len(args) > m.splits else None
                self.add(m.kind, nbytes(args[m.payload]), target.size(), target.rank(), splits,
                         dtype_name(args[m.payload]), target.group_name)
        else:  # "op": a functional collective; the group name is the last argument
            from torch.distributed.distributed_c10d import _resolve_process_group

            kind, index = ops.FUNCTIONAL_OPS[name]
            pg = _resolve_process_group(kwargs.get("group_name", args[-1]))
            splits = args[ops.FUNCTIONAL_SPLITS] if kind == "all_to_all" else None
            self.add(kind, nbytes(args[index]), pg.size(), pg.rank(), splits, dtype_name(args[index]), pg.group_name)
        return None  # nothing to hear afterwards
