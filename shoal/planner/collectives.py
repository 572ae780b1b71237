"""Alpha-beta times for collectives, with nccl-tests bus-bandwidth conventions.

A collective over n ranks moving S bytes takes  latency + S * factor / busbw,  where factor is the
nccl-tests one (shoal.comm.ops, the one table of them): all_reduce 2(n-1)/n with S the per-rank buffer; all_gather and reduce_scatter
(n-1)/n with S the full (gathered) buffer; all_to_all (n-1)/n with S the per-rank send buffer.
So the bus bandwidth a nccl-tests run reports on a tier is exactly the busbw used here.

When a group spans nodes (g members per node, k = n/g nodes) NCCL's ring still runs over all n
ranks as one pipeline: each chunk crosses NVLink and network hops at once, so the ring moves at its
slowest hop's bandwidth, and each of a node's g members leaves the node on its own NIC for 1/g of the
ring's channels, so the network side carries g NICs' worth (ring_busbw). A phase over NVLink followed
by a phase over the network, which this model used to charge, takes up to twice as long. Latency, as NCCL's own cost model counts it (src/graph/tuning.cc, ncclTopoTuneModel, NVIDIA/nccl at
01afd20): a ring over n ranks on k nodes takes n-1 steps (all_reduce 2(n-1)), k-1 of them across nodes
(all_reduce 2(k-1)) and the other n-k over NVLink — so ring latency grows with the ranks, not the nodes,
and a multi-node all_reduce ring of a large buffer pays 1.9x it ("plateau effect of ring"). all_reduce
may instead run NCCL's tree: 2·((g-1) + log2 k) steps, each a 256 kB chunk's latency (28 us on NVLink
and 50 us on the network against the ring's 3.4 and 9.6, Simple protocol), at 0.9 of the ring's
bandwidth; NCCL picks the faster, and so does all_reduce() here. all_gather and reduce_scatter have only
the ring, which is what makes giant ZeRO-3 groups latency-bound.

Beyond a leaf (or rail) group of nodes the traffic climbs to the spine: with oversubscription x
(downlinks : uplinks), a group wider than the leaf gets 1/x of its inter-node bandwidth and two more
switch hops per step. DGX SuperPODs are non-blocking fat trees (x = 1, the catalog's default); Meta's
Llama 3 RoCE fabric gives each 3,072-GPU pod full bisection and 1:7 oversubscription between pods
(Llama 3 paper, §3.3.1): --hw nodes_per_leaf=384 --hw oversubscription=7.

A TPU slice is no switched node but a torus (torus.py): a group gets the ICI bandwidth of every torus
axis it spans, and its ring latency counts hops along those axes, not ranks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

from shoal.comm.ops import bus_factor
from shoal.planner import torus


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
    slice_shape: tuple[int, ...] = ()
    """A torus node (TPU slice): the size of each of its axes (torus.slice_shape); () for a switched node."""
    group_axes: tuple[int, ...] = ()
    """Set by for_group on a torus: the sizes of the slice axes the group spans."""
    wraparound: bool = True
    """Whether the torus axes close into rings (torus.has_wraparound)."""

    def for_group(self, n: int, stride: int) -> "Network":
        """The network one group of n ranks, stride apart, sees. Switched nodes: the same for every group. A
        torus: intra_busbw is per axis, so the group gets it once per axis it spans (half without
        wraparound, a line not a ring), and its ring latency counts hops along those axes."""
        if not self.slice_shape or n <= 1:
            return self
        return _torus_group(self, n, stride)

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


@lru_cache(maxsize=4096)
def _torus_group(net: Network, n: int, stride: int) -> Network:
    axes = torus.axes_spanned(net.slice_shape, n, stride)
    per_axis = net.intra_busbw * (1.0 if net.wraparound else 0.5)
    return dataclasses.replace(net, intra_busbw=per_axis * len(axes), group_axes=axes)


RING_PLATEAU = 1.9
"""NCCL multiplies a multi-node ring all_reduce's latency by 1.9 once the buffer is past nRanks/16 x 64 KiB
(tuning.cc, ncclTopoGetAlgoTime: "Plateau effect of ring"); gradient buckets always are."""
TREE_STEP_INTRA, TREE_STEP_INTER = 28 / 3.4, 50 / 9.6
"""A tree step against a ring step, inside a node and across nodes: NCCL's hwLat for Simple, Tree
28 us vs Ring 3.4 us on NVLink and 50 vs 9.6 on the network (tuning.cc); our latencies are ring steps."""
TREE_BANDWIDTH = 0.9
"""NCCL's tree runs at 0.9 of the bus bandwidth the ring gets (tuning.cc: busBw*.9)."""


def _inter_steps(k: int) -> int:
    return max(1, math.ceil(math.log2(k)))


def _ring_latency(n: int, k: int, net: Network, rounds: int) -> float:
    """NCCL's ring: rounds x (n-1) steps, rounds x (k-1) of them across nodes, the rest on NVLink. On a
    torus the intra-node part is the hops of bidirectional rings along the group's axes (torus.ring_hops)."""
    intra_steps = torus.ring_hops(net.group_axes, net.wraparound) if net.group_axes else n - k
    return rounds * (intra_steps * net.intra_latency + (k - 1) * net.inter_hop_latency(k))


def ring_busbw(g: int, k: int, net: Network) -> float:
    """Bus bandwidth of NCCL's ring (and tree) over k nodes of g group members each. NCCL's cost model
    gives a collective one bus bandwidth, nChannels x the per-channel bandwidth of its graph (bwIntra on
    one or two nodes, bwInter beyond: ncclTopoTuneModel in src/graph/tuning.cc, NVIDIA/nccl at 5067397),
    not an NVLink time plus a network time: the ring is a pipeline whose hops all run at once, so its
    slowest hop sets the pace. Each of a node's g members is the ring's way out of the node for 1/g of
    the channels (a rail-aligned fabric, one NIC per GPU), so the network side moves g x inter_bw for
    each member: an 8-GPU H100 node's eight 400 Gb/s NICs (8 x 45 GB/s) keep up with NVLink's 360."""
    if k == 1:
        return net.intra_busbw
    if g == 1:
        return net.inter_bw(k)
    return min(net.intra_busbw, g * net.inter_bw(k))


def all_reduce(nbytes: float, n: int, per_node: int, net: Network) -> float:
    """Time for an all_reduce of a `nbytes` buffer on every rank: the faster of NCCL's ring and tree."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    g, k = min(per_node, n), max(1, n // min(per_node, n))
    wire = nbytes * bus_factor("all_reduce", n) / ring_busbw(g, k, net)
    if k == 1:
        return _ring_latency(n, 1, net, 2) + wire
    ring = RING_PLATEAU * _ring_latency(n, k, net, 2) + wire
    tree = (2 * ((g - 1) * TREE_STEP_INTRA * net.intra_latency + _inter_steps(k) * TREE_STEP_INTER
                 * net.inter_hop_latency(k)) + wire / TREE_BANDWIDTH)
    return min(ring, tree)


def all_gather(nbytes: float, n: int, per_node: int, net: Network) -> float:
    """Time to all_gather a buffer of `nbytes` in total (each rank contributes nbytes/n)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    g, k = min(per_node, n), max(1, n // min(per_node, n))
    return _ring_latency(n, k, net, 1) + nbytes * bus_factor("all_gather", n) / ring_busbw(g, k, net)


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
    latency = max(1, g - 1) * net.intra_latency if n == g else _inter_steps(k) * net.inter_hop_latency(k) + net.intra_latency
    return latency + max(intra, inter)


def all_to_all_via_nodes(token_bytes: float, rank_copies: float, node_copies: float, n: int, per_node: int,
                         net: Network) -> float:
    """Time for an expert dispatch (or combine) that crosses the network once per node, as DeepEP's internode
    kernels do (DeepSeek-V3 §3.2.2): a token goes over the NIC to the GPU of the same local index on each node
    holding one of its experts, which forwards it over NVLink to each of them. `token_bytes` is every token this
    rank sends once, `rank_copies` the ranks a token goes to (its NVLink side: every copy but the one that lands
    where it arrives) and `node_copies` the nodes (its network side: all but its own). Both at once, as
    all_to_all. The kernels write into every peer's buffer at once from their own SMs, so the exchange waits one
    NVLink hop inside the node, not one per peer as all_to_all's grouped send/recv does, whether or not it also
    crosses the network."""
    g = min(per_node, n)
    if n <= g:
        return net.intra_latency + token_bytes * rank_copies * (n - 1) / n / net.intra_busbw
    k = max(1, n // g)
    intra = token_bytes * rank_copies * (g - 1) / g / net.intra_busbw
    inter = token_bytes * node_copies * (k - 1) / k / net.inter_bw(k)
    return _inter_steps(k) * net.inter_hop_latency(k) + net.intra_latency + max(intra, inter)


def overlap(comm: float, compute: float, cost: float) -> float:
    """Time a collective adds when it runs beside `compute` seconds of kernels; `cost` is the share of
    the hidden part still paid (the device's overlap_cost, or for the data-parallel rings ring_overlap_cost)."""
    hidden = min(comm, compute)
    return (comm - hidden) + cost * hidden


def p2p(nbytes: float, same_node: bool, net: Network) -> float:
    """One send/recv between two ranks (pipeline stages)."""
    if nbytes <= 0:
        return 0.0
    if same_node:
        return net.intra_latency + nbytes / net.intra_busbw
    return net.inter_latency + nbytes / net.inter_busbw
