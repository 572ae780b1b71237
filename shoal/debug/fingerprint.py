"""Fingerprints: what one rank passed to one collective, and what must agree across ranks.

A fingerprint is a small dict of strings. `key(fp)` is the part every rank of the group must
agree on (op, shapes, dtypes, reduce op, root); the call site is shown but never compared, since
ranks may legitimately reach the same collective from different lines (`if rank == 0: ...`).
Ops whose inputs legitimately differ per rank get their own rule: gather/scatter compare only
the side every rank passes, all_to_all compares trailing dims and cross-checks the split sizes.
"""

from __future__ import annotations

import torch

from shoal.comm.ops import PG_METHODS

COMPARED = ("op", "shapes", "dtypes", "reduce", "root")
_A2A = {"all_to_all_single", "all_to_all"}


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))  # "(4, 8)", "(4,)", "()"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def describe(x) -> tuple[str, str] | None:
    """(shapes, dtypes) of a tensor, a list of tensors or a list of lists; None if no tensor."""
    if isinstance(x, torch.Tensor):
        return _shape(x), _dtype(x)
    if isinstance(x, (list, tuple)) and len(x) == 1:  # c10d wraps single tensors in a list
        return describe(x[0])
    if isinstance(x, (list, tuple)) and x:
        parts = [describe(y) for y in x]
        if any(p is None for p in parts):
            return None
        shapes, dtypes = [p[0] for p in parts], [p[1] for p in parts]
        shape = f"{len(x)}×{shapes[0]}" if len(set(shapes)) == 1 else "[" + ", ".join(shapes) + "]"
        return shape, dtypes[0] if len(set(dtypes)) == 1 else "[" + ", ".join(dtypes) + "]"
    return None


_reduce_names: dict = {}


def _reduce_name(op) -> str:
    op = getattr(op, "op", op)  # ReduceOp wraps a RedOpType
    name = _reduce_names.get(op)
    if name is None:
        name = _reduce_names[op] = str(getattr(op, "name", op)).split(".")[-1].upper()
    return name


def _options(args) -> dict[str, str]:
    """reduce op and root from a c10d *Options object or the (tensor, root[, op]) overloads."""
    out = {}
    for a in args:
        if hasattr(a, "reduceOp"):
            out["reduce"] = _reduce_name(a.reduceOp)
        if hasattr(a, "rootRank"):
            out["root"] = str(a.rootRank)
        if type(a).__name__ == "ReduceOp" or type(a).__name__ == "RedOpType":
            out["reduce"] = _reduce_name(a)
    return out


def from_pg_call(op: str, args: tuple) -> dict[str, str]:
    """Fingerprint of `ProcessGroup.<op>(*args)` as torch.distributed calls it."""
    method = PG_METHODS[op]
    fp = {"op": method.op}
    fp.update(_options(args))
    if "root" not in fp and op in ("broadcast", "reduce", "gather", "scatter"):
        # the (tensor, root, ...) overloads pass the root as the first int
        ints = [a for a in args if isinstance(a, int) and not isinstance(a, bool)]
        if ints:
            fp["root"] = str(ints[0])
    roles = method.roles  # None: only the root passes it (gather's outputs, scatter's inputs), not compared
    described = []
    for i, role in enumerate(roles):
        d = describe(args[i]) if role is not None and i < len(args) else None
        if d is not None:
            described.append((f"{role} " if len(roles) > 1 and role else "", d))
    fp["shapes"] = "; ".join(label + d[0] for label, d in described)
    dtypes = {d[1] for _, d in described}
    fp["dtypes"] = dtypes.pop() if len(dtypes) <= 1 and dtypes else "; ".join(label + d[1] for label, d in described)
    if fp["op"] in _A2A:
        fp.update(_a2a(op, args))
    return fp


def _a2a(op: str, args: tuple) -> dict[str, str]:
    """all_to_all: per-rank shapes differ by design; keep what must line up across ranks."""
    def rows(t: torch.Tensor) -> str:  # the shape of one row: everything after dim 0
        return str(tuple(t.shape[1:]))

    if op in ("alltoall_base", "all_to_all_single"):
        out, inp, out_splits, in_splits = args[0], args[1], list(args[2]), list(args[3])
        # empty split lists mean "dim 0 split evenly"; `=N` records N so the cross-check can split it
        return {"rows": rows(inp),
                "in_splits": ",".join(map(str, in_splits)) if in_splits else f"={inp.shape[0] if inp.dim() else 0}",
                "out_splits": ",".join(map(str, out_splits)) if out_splits else f"={out.shape[0] if out.dim() else 0}"}
    outs, ins = list(args[0]), list(args[1])
    return {"rows": rows(ins[0]) if ins else "",
            "in_splits": ",".join(str(t.shape[0] if t.dim() else 1) for t in ins),
            "out_splits": ",".join(str(t.shape[0] if t.dim() else 1) for t in outs)}


def from_funcol(op: str, tensor, reduce, root, out_splits, in_splits) -> dict[str, str]:
    """Fingerprint of a functional collective (DTensor's path): its input, reduce op, root, splits."""
    d = describe(tensor) or ("", "")
    fp = {"op": op, "shapes": d[0], "dtypes": d[1]}
    if reduce is not None:
        fp["reduce"] = str(reduce).upper()
    if root is not None:
        fp["root"] = str(root)
    if op == "all_to_all_single" and isinstance(tensor, torch.Tensor):
        dim0 = tensor.shape[0] if tensor.dim() else 0
        fp["rows"] = str(tuple(tensor.shape[1:]))
        fp["in_splits"] = ",".join(map(str, in_splits)) if in_splits else f"={dim0}"
        fp["out_splits"] = ",".join(map(str, out_splits)) if out_splits else f"={dim0}"
    return fp


def from_p2p(op: str, tensors, tag: int) -> dict[str, str]:
    d = describe(list(tensors)) if len(tensors) > 1 else describe(tensors[0])
    return {"op": op, "shapes": d[0], "dtypes": d[1], "tag": str(tag)}


def key(fp: dict[str, str]) -> str:
    """The part of a fingerprint every rank must agree on, as one short string."""
    if fp["op"] in _A2A:
        return "|".join((fp["op"], fp["dtypes"], fp.get("rows", "")))
    return "|".join(fp.get(f, "") for f in COMPARED)


def splits(fp: dict[str, str], n: int) -> tuple[list[int], list[int]]:
    """all_to_all: rows this rank sends to / expects from each of the n group ranks."""
    def parse(s: str) -> list[int]:
        if s.startswith("="):  # dim 0 split evenly
            return [int(s[1:]) // n] * n
        return [int(x) for x in s.split(",")] if s else [0] * n
    return parse(fp["in_splits"]), parse(fp["out_splits"])


def split_errors(ins: list[list[int]], outs: list[list[int]]) -> list[str]:
    """What group rank i sends to j must be what j expects from i."""
    n = len(ins)
    return [f"group rank {i} sends {ins[i][j]} rows to group rank {j}, which expects {outs[j][i]}"
            for i in range(n) for j in range(n)
            if len(ins[i]) == n and len(outs[j]) == n and ins[i][j] != outs[j][i]]


def differing(fps: list[dict[str, str]]) -> list[str]:
    """Names of the compared fields whose values are not the same on every rank."""
    fields = ("op", "dtypes", "rows") if fps and fps[0]["op"] in _A2A else COMPARED
    fields = fields + ("tag",) if fps and "tag" in fps[0] else fields
    return [f for f in fields if len({fp.get(f, "") for fp in fps}) > 1]
