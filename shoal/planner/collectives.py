"""Alpha-beta times for collectives, with nccl-tests bus-bandwidth conventions.

A collective over n ranks moving S bytes takes  latency + S * factor / busbw,  where factor is the
nccl-tests one (shoal.comm.ops, the one table of them): all_reduce 2(n-1)/n with S the per-rank buffer; all_gather and reduce_scatter
(n-1)/n with S the full (gathered) buffer; all_to_all (n-1)/n with S the per-rank send buffer.
So the bus bandwidth a nccl-tests run reports on a tier is exactly the busbw used here.

When a group spans nodes (g members per node, k = n/g nodes) the collective is hierarchical, as
NCCL does it: reduce-scatter inside the node over NVLink, then the inter-node part on 1/g of the
data — all g GPUs of a node drive their own NICs at once — then all-gather inside the node.
Latency: ring steps inside a node. Across nodes all_reduce uses NCCL's tree (2·log2 k steps), which
keeps it usable on thousands of nodes; all_gather and reduce_scatter have only the ring (k-1 steps),
which is what makes giant ZeRO-3 groups latency-bound.

Beyond a leaf (or rail) group of nodes the traffic climbs to the spine: with oversubscription x
(downlinks : uplinks), a group wider than the leaf gets 1/x of its inter-node bandwidth and two more
switch hops per step. DGX SuperPODs are non-blocking fat trees (x = 1, the catalog's default); Meta's
Llama 3 RoCE fabric gives each 3,072-GPU pod full bisection and 1:7 oversubscription between pods
(Llama 3 paper, §3.3.1): --hw nodes_per_leaf=384 --hw oversubscription=7.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shoal.comm.ops import bus_factor


@dataclass(frozen=True)
class Network:
    """The tiers one group sees: inside a node, between nodes under one leaf (or rail) switch group,
    and beyond it through the spine."""

    intra_busbw: float
    intra_latency: float
    inter_busbw: float
    inter_latency: float
    nodes_per_leaf: int = 0
    """Nodes with full bisection bandwidth among themselves (0: the whole fabric is non-blocking)."""
    oversubscription: float = 1.0
    """Leaf downlink : uplink ratio. A group spanning more than nodes_per_leaf nodes sends its inter-node
    traffic through the uplinks, which every GPU of the job loads at once in a data-parallel collective,
    so each GPU gets inter_busbw / oversubscription there."""

    def inter_bw(self, k: int) -> float:
        """Bus bandwidth per GPU for a group spanning k nodes."""
        if self.nodes_per_leaf and k > self.nodes_per_leaf:
            return self.inter_busbw / self.oversubscription
        return self.inter_busbw

    def inter_hop_latency(self, k: int) -> float:
        """Latency of one step across nodes; leaving the leaf adds two more switch hops (leaf-spine-leaf)."""
        if self.nodes_per_leaf and k > self.nodes_per_leaf:
            return 1.5 * self.inter_latency
        return self.inter_latency


def _intra_steps(g: int) -> int:
    return max(1, g - 1)


def _inter_steps(k: int) -> int:
    return max(1, math.ceil(math.log2(k)))


def all_reduce(nbytes: float, n: int, per_node: int, net: Network) -> float:
    """Time for an all_reduce of a `nbytes` buffer on every rank."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    g, k = min(per_node, n), max(1, n // min(per_node, n))
    if k == 1:
        return 2 * _intra_steps(g) * net.intra_latency + nbytes * bus_factor("all_reduce", g) / net.intra_busbw
    inter = 2 * _inter_steps(k) * net.inter_hop_latency(k) + (nbytes / g) * bus_factor("all_reduce", k) / net.inter_bw(k)
    if g == 1:
        return inter
    return 2 * reduce_scatter(nbytes, g, g, net) + inter  # reduce-scatter and all-gather inside the node


def all_gather(nbytes: float, n: int, per_node: int, net: Network) -> float:
    """Time to all_gather a buffer of `nbytes` in total (each rank contributes nbytes/n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    g, k = min(per_node, n), max(1, n // min(per_node, n))
    intra = 0.0 if g == 1 else _intra_steps(g) * net.intra_latency + nbytes * bus_factor("all_gather", g) / net.intra_busbw
    if k == 1:
        return intra
    # Across nodes first, on each GPU's own NIC: every GPU ends up with its node-slot's 1/g share.
    inter = (k - 1) * net.inter_hop_latency(k) + (nbytes / g) * bus_factor("all_gather", k) / net.inter_bw(k)
    return inter + intra


def reduce_scatter(nbytes: float, n: int, per_node: int, net: Network) -> float:
    """Time to reduce_scatter a buffer of `nbytes` in total (each rank keeps nbytes/n). Mirrors all_gather."""
    return all_gather(nbytes, n, per_node, net)


def all_to_all(nbytes: float, n: int, per_node: int, net: Network) -> float:
    """Time for an all_to_all where every rank sends `nbytes` in total (1/n of it to each peer).

    The share bound for peers on other nodes, (n-g)/n, goes over the NIC; the rest over NVLink;
    both at once, so the slower one sets the time.
    """
    if n <= 1 or nbytes <= 0:
        return 0.0
    g = min(per_node, n)
    intra = nbytes * (g - 1) / n / net.intra_busbw
    k = max(1, n // g)
    inter = nbytes * (n - g) / n / net.inter_bw(k)
    latency = _intra_steps(g) * net.intra_latency if n == g else _inter_steps(k) * net.inter_hop_latency(k) + net.intra_latency
    return latency + max(intra, inter)


def p2p(nbytes: float, same_node: bool, net: Network) -> float:
    """One send/recv between two ranks (pipeline stages)."""
    if nbytes <= 0:
        return 0.0
    if same_node:
        return net.intra_latency + nbytes / net.intra_busbw
    return net.inter_latency + nbytes / net.inter_busbw
