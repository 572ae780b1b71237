"""Bandwidth the way nccl-tests reports it, so numbers compare across tools and clusters.

`size` is nccl-tests' byte count for the op: the whole buffer for all_reduce, broadcast and
send/recv; the whole gathered output for all_gather; the whole input for reduce_scatter; the
whole send buffer of one rank for all_to_all. algbw = size / time. busbw scales algbw by the
fraction of the data each rank must move over its link in an optimal algorithm, so it is
comparable to the link's peak bandwidth whatever n is:

    all_reduce                          busbw = algbw * 2(n-1)/n
    all_gather, reduce_scatter, all_to_all  busbw = algbw * (n-1)/n
    broadcast, reduce, send/recv        busbw = algbw
"""

from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv")


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def algbw(size_bytes: int, time_s: float) -> float:
    """Bytes per second (divide by 1e9 for GB/s)."""
    return size_bytes / time_s


def busbw(op: str, size_bytes: int, time_s: float, n: int) -> float:
    return algbw(size_bytes, time_s) * bus_factor(op, n)
