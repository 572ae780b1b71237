"""ONE table of collective ops: kinds, bus factors, payloads, roles, and the names torch calls them by.

Torch-free on purpose: the planner reads the bus factors, the patch layer (patch.py), the byte
counter, the collective checker's fingerprints and `shoal doctor` read the rest.

Kinds and bus factors follow nccl-tests (doc/PERFORMANCE.md there). For a group of n ranks and a
"size" as nccl-tests counts it, algbw = size / time and busbw = algbw x factor, where the factor is
the share of the data each rank must move over its link in an optimal (ring) algorithm:

    kind            size (nccl-tests)                    bus factor   bytes one rank sends (ring)
    all_reduce      the buffer                           2(n-1)/n     2(n-1)/n x size
    all_gather      the gathered output                  (n-1)/n      (n-1)/n x size
    reduce_scatter  the whole input                      (n-1)/n      (n-1)/n x size
    all_to_all      one rank's send buffer               (n-1)/n      size minus its own chunk
    broadcast       the buffer                           1            (n-1)/n x size (a chain)
    reduce          the buffer                           1
    send / recv     the message                          1            size (send) / 0 (recv)

gather, scatter and barrier have no nccl-tests bus factor; they are named so the checker can
compare them, and the byte counter does not count them (no layout issues them inside a step).
"""

from __future__ import annotations

from dataclasses import dataclass

BUS_FACTOR_NUMERATOR = {  # bus factor = numerator(n) / n; kept as a table of rules, see bus_factor
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
    "broadcast": lambda n: n,
    "reduce": lambda n: n,
    "send": lambda n: n,
    "recv": lambda n: n,
    "sendrecv": lambda n: n,  # `shoal doctor`'s ring of send/recv pairs
}
BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")  # shoal doctor


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw for `kind` over n ranks (table above)."""
    if kind not in BUS_FACTOR_NUMERATOR:
        raise ValueError(f"unknown collective kind {kind!r}")
    return BUS_FACTOR_NUMERATOR[kind](n) / n


def busbw(kind: str, size_bytes: float, time_s: float, n: int) -> float:
    """Bus bandwidth in bytes/s for an op that moved `size_bytes` (nccl-tests' size) in `time_s`."""
    return size_bytes / time_s * bus_factor(kind, n)


@dataclass(frozen=True)
class Method:
    """A ProcessGroup method: every Python-level c10d API (dist.all_reduce, FSDP2's
    all_gather_single, pipelining's P2POp batches, the *_object collectives) ends in one."""

    kind: str
    op: str  # the name ranks compare: a method and its functional-collective twin agree
    friendly: str  # the name users know, shown when no torch.distributed API frame names the call
    roles: tuple = ("",)  # roles of the leading tensor arguments; None: only the root passes it
    payload: int | None = None  # the argument holding what this rank sends; None: not counted
    splits: int | None = None  # all_to_all: the argument with this rank's input split sizes


def _m(kind, op, friendly=None, roles=("",), payload=None, splits=None) -> Method:
    return Method(kind, op, friendly or op, roles, payload, splits)


_IO = ("out", "in")
PG_METHODS = {
    "allreduce": _m("all_reduce", "all_reduce", payload=0),
    "allreduce_coalesced": _m("all_reduce", "all_reduce_coalesced", payload=0),
    "allgather": _m("all_gather", "all_gather", roles=_IO, payload=1),
    "allgather_coalesced": _m("all_gather", "allgather_coalesced", "all_gather_coalesced", _IO),
    "all_gather_single": _m("all_gather", "all_gather_single", roles=_IO, payload=1),
    "_allgather_base": _m("all_gather", "all_gather_single", "all_gather_into_tensor", _IO, 1),
    "allgather_into_tensor_coalesced": _m("all_gather", "all_gather_single_coalesced",
                                          "all_gather_into_tensor_coalesced", _IO, 1),
    "all_gather_single_coalesced": _m("all_gather", "all_gather_single_coalesced", roles=_IO, payload=1),
    "reduce_scatter": _m("reduce_scatter", "reduce_scatter", roles=_IO, payload=1),
    "reduce_scatter_single": _m("reduce_scatter", "reduce_scatter_single", roles=_IO, payload=1),
    "_reduce_scatter_base": _m("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", _IO, 1),
    "reduce_scatter_tensor_coalesced": _m("reduce_scatter", "reduce_scatter_single_coalesced",
                                          "reduce_scatter_tensor_coalesced", _IO, 1),
    "reduce_scatter_single_coalesced": _m("reduce_scatter", "reduce_scatter_single_coalesced", roles=_IO, payload=1),
    "alltoall": _m("all_to_all", "all_to_all", roles=_IO),
    "alltoall_base": _m("all_to_all", "all_to_all_single", roles=_IO, payload=1, splits=3),
    "all_to_all_single": _m("all_to_all", "all_to_all_single", roles=_IO, payload=1, splits=3),
    "broadcast": _m("broadcast", "broadcast", payload=0),
    "reduce": _m("reduce", "reduce"),
    "gather": _m("gather", "gather", roles=(None, "in")),
    "scatter": _m("scatter", "scatter", roles=("out", None)),
    "barrier": _m("barrier", "barrier"),
    "monitored_barrier": _m("barrier", "monitored_barrier"),
    "send": _m("send", "send", payload=0),
    "recv": _m("recv", "recv"),
    "recv_anysource": _m("recv", "recv_anysource", "recv"),
}
P2P = ("send", "recv", "recv_anysource")  # ProcessGroup methods with a peer instead of a group-wide call
COALESCING = ("_start_coalescing", "_end_coalescing")  # NCCL-style batches: one Work at the end

# torch.distributed._functional_collectives (DTensor, tensor parallelism): function -> the op it
# performs, in PG_METHODS' `op` vocabulary (callers reach the same op through different names).
FUNCOL = {
    "broadcast": "broadcast", "all_reduce": "all_reduce", "all_reduce_inplace": "all_reduce",
    "all_gather_single": "all_gather_single", "all_gather_single_autograd": "all_gather_single",
    "all_gather_tensor": "all_gather_single", "all_gather_tensor_autograd": "all_gather_single",
    "all_gather_inplace": "all_gather_single", "reduce_scatter_single": "reduce_scatter_single",
    "reduce_scatter_single_autograd": "reduce_scatter_single", "reduce_scatter_tensor": "reduce_scatter_single",
    "reduce_scatter_tensor_autograd": "reduce_scatter_single", "all_reduce_coalesced": "all_reduce_coalesced",
    "all_gather_single_coalesced": "all_gather_single_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_single_coalesced",
    "reduce_scatter_single_coalesced": "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_single_coalesced",
    "all_to_all_single": "all_to_all_single", "all_to_all_single_autograd": "all_to_all_single",
    "all_to_all_inplace": "all_to_all_single", "permute_tensor": "permute_tensor",
}
DTENSOR_MODULES = ("torch.distributed.tensor._collective_utils", "torch.distributed.tensor.placement_types")

# torch.ops._c10d_functional packets, what the functions above (and their Python backward
# formulas) finally call: op -> (kind, index of the payload argument). The group name is the last
# argument; all_to_all_single's input split sizes are argument 2.
FUNCTIONAL_OPS = {
    "all_reduce": ("all_reduce", 0), "all_reduce_": ("all_reduce", 0), "all_reduce_coalesced": ("all_reduce", 0),
    "all_gather_into_tensor": ("all_gather", 0), "all_gather_into_tensor_coalesced": ("all_gather", 0),
    "reduce_scatter_tensor": ("reduce_scatter", 0), "reduce_scatter_tensor_coalesced": ("reduce_scatter", 0),
    "all_to_all_single": ("all_to_all", 0), "broadcast": ("broadcast", 0), "isend": ("send", 0),
}
FUNCTIONAL_SPLITS = 2


def wire_bytes(kind: str, payload: int, n: int, own_chunk: int | None = None) -> float:
    """Bytes one rank sends for a collective over n ranks, by the ring column of the table above.

    payload is the buffer this rank contributes (for all_gather: its input, a 1/n share of the
    output); own_chunk (all_to_all) is the part of it the rank sends itself.
    """
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
    assert kind == "send", kind
    return float(payload)


def own_chunk(payload: int, splits, rank: int, n: int) -> int:
    """The part of an all-to-all's input a rank sends itself (it never leaves the rank)."""
    splits = list(splits or [])
    return payload * splits[rank] // sum(splits) if splits and sum(splits) else payload // n


def friendly(name: str) -> str:
    """The name users know a ProcessGroup method by (other names pass through)."""
    method = PG_METHODS.get(name)
    return method.friendly if method is not None else name
