"""The multi-node flags `shoal train` and `shoal doctor` share (shoal/launch/multinode.py uses them)."""

from __future__ import annotations

from shoal.cli.argtypes import non_empty, positive_int
from shoal.launch.multinode import DEFAULT_PORT


def add_node_args(p) -> None:
    p.add_argument("--nnodes", type=positive_int, default=1, help="machines in the job; run the same command on each")
    p.add_argument("--node-rank", type=int, default=0, help="this machine's index; 0 hosts the rendezvous at --master")
    # None is "not given" (the commands pass ""); an empty value typed is refused, not read as left out
    p.add_argument("--master", type=non_empty("--master 10.0.0.1:29500"), default=None, metavar="HOST[:PORT]",
                   help=f"node 0's address as the other nodes reach it (port default {DEFAULT_PORT})")
    p.add_argument("--ifname", type=non_empty("--ifname eth0"), default=None,
                   help="network interface for gloo (default: the one that routes to --master)")
    p.add_argument("--rdzv-timeout", type=int, default=120,
                   help="seconds each node waits for the master and the other nodes")
    p.add_argument("--rdzv", choices=("c10d", "static"), default="c10d",
                   help="c10d: nodes are numbered by sorting their addresses, and a node whose workers die can "
                        "rejoin (--max-restarts); static: numbered by --node-rank (what `shoal slurm` uses, so rank "
                        "blocks follow the allocation), the whole job restarts together")
