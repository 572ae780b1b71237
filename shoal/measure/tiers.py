"""The worker side of `shoal doctor --nnodes`: the shared directory, then all_reduce on each network tier.

    python -m shoal.measure.tiers --dir DIR --size BYTES --budget S --report PATH

Run on every node by its `shoal doctor --nnodes` (shoal/measure/node_doctor.py). With the process
group up it probes DIR (shoal/launch/shared_dir.py, the check `shoal train` makes before its first
save), then times an all_reduce of --size bytes over the ranks of each node (all nodes at once:
the intra-node tier) and over one rank per node (the inter-node link, one rank per node sending,
as a data-parallel group with TP inside the node would). The first rank of each node writes its
node's results to PATH, on that node's own disk.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.comm.ops import busbw
from shoal.worker.shared_dir import node_name, unshared_nodes
from shoal.worker.exit import exit_worker
from shoal.measure.commbench import Bench, join_job


def tier_groups() -> tuple[list[list[int]], list[list[int]]]:
    """(the ranks of each node, groups of one rank per node: each node's i-th rank) by global rank."""
    names: list = [None] * dist.get_world_size()
    dist.all_gather_object(names, node_name())
    nodes = [[r for r, n in enumerate(names) if n == name] for name in dict.fromkeys(names)]
    across = [[ranks[i] for ranks in nodes] for i in range(min(len(ranks) for ranks in nodes))]
    return nodes, across


def measure(groups: list[list[int]], device: torch.device, size: int, budget_s: float,
            only_first: bool = False) -> dict | None:
    """all_reduce busbw of the group holding this rank (None when this rank is in none of them)."""
    handles = [dist.new_group(g) for g in groups]  # every rank creates every group, in the same order
    mine = next((i for i, g in enumerate(groups) if dist.get_rank() in g), None)
    if mine is None or (only_first and mine):
        return None
    bench = Bench(device, budget_s, max_iters=20, group=handles[mine])
    call, nbytes = bench.buffers("all_reduce", size)
    seconds = max(bench.gather(bench.time(call)[0]))  # done when the slowest rank is
    n = len(groups[mine])
    return {"ranks": groups[mine], "bytes": nbytes, "time_s": seconds, "busbw": busbw("all_reduce", nbytes, seconds, n)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--report", required=True)
    args = p.parse_args()
    device = join_job()
    not_shared = unshared_nodes(Path(args.dir).resolve())
    nodes, across = tier_groups()
    inside = measure(nodes, device, args.size, args.budget)
    dist.barrier()
    outside = measure(across, device, args.size, args.budget, only_first=True) if len(nodes) > 1 else None
    dist.barrier()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with open(args.report, "w") as f:
            json.dump({"node": node_name()[0], "world": dist.get_world_size(), "nodes": len(nodes),
                       "not_shared": not_shared, "inside": inside, "across": outside}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_worker(0)
