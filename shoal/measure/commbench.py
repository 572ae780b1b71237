"""The worker side of `shoal doctor`'s benchmark: run as N ranks by the launcher.

    python -m shoal.measure.commbench --out bench.json --sizes 1024,4096 [--ops all_reduce,...]

For every op and size it times the collective on every rank and rank 0 writes the raw per-rank
seconds per iteration to JSON; `shoal.measure.doctor.summarize` turns them into algbw/busbw rows.
It also times a matmul per rank (compute speed, for stragglers). NCCL on CUDA devices, gloo on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from shoal.comm.ops import BENCH_OPS
from shoal.comm.renamed import all_gather_single, reduce_scatter_single
from shoal.worker.exit import exit_worker
from shoal.hardware.matmul import matmul_flops

ELEM = 4  # float32 bytes


class Bench:
    """Times collectives over `group` (default: the whole job); `shoal doctor --nnodes` passes the
    ranks of one node, or one rank per node, to measure each network tier."""

    def __init__(self, device: torch.device, budget_s: float, max_iters: int, group=None):
        self.device, self.budget_s, self.max_iters, self.group = device, budget_s, max_iters, group
        self.rank, self.n = dist.get_rank(group), dist.get_world_size(group)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def buffers(self, op: str, size: int):
        """(call, bytes as nccl-tests counts them) for one op at about `size` bytes."""
        n, dev, g = self.n, self.device, self.group
        count = max(1, size // ELEM)
        if op == "all_reduce":
            x = torch.ones(count, device=dev)
            return (lambda: dist.all_reduce(x, group=g)), count * ELEM
        if op == "broadcast":
            x = torch.ones(count, device=dev)
            return (lambda: dist.broadcast(x, group_src=0, group=g)), count * ELEM
        if op in ("all_gather", "reduce_scatter", "all_to_all"):
            per_rank = max(1, count // n)
            big, small = torch.ones(per_rank * n, device=dev), torch.ones(per_rank, device=dev)
            if op == "all_gather":  # size = the gathered output
                return (lambda: all_gather_single(big, small, group=g)), per_rank * n * ELEM
            if op == "reduce_scatter":  # size = the input
                return (lambda: reduce_scatter_single(small, big, group=g)), per_rank * n * ELEM
            out = torch.empty_like(big)  # all_to_all: size = one rank's send buffer
            return (lambda: dist.all_to_all_single(out, big, group=g)), per_rank * n * ELEM
        if op == "sendrecv":  # a ring: send to the next rank, receive from the previous one
            send, recv = torch.ones(count, device=dev), torch.empty(count, device=dev)
            nxt, prv = (self.rank + 1) % n, (self.rank - 1) % n

            def ring():
                for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, group=g, group_peer=nxt),
                                                 dist.P2POp(dist.irecv, recv, group=g, group_peer=prv)]):
                    w.wait()
            return ring, count * ELEM
        raise ValueError(op)

    def agree(self, value: float) -> float:
        """The max over ranks, so every rank runs the same number of iterations."""
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.item()

    def time(self, call) -> tuple[float, int]:
        """Seconds per iteration on this rank, and the iteration count."""
        call()  # warm up: first use of a size sets up buffers and connections
        self.sync()
        t0 = time.perf_counter()
        call()
        self.sync()
        estimate = self.agree(time.perf_counter() - t0)
        iters = int(max(1, min(self.max_iters, self.budget_s / max(estimate, 1e-9))))
        dist.barrier(group=self.group)
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        self.sync()
        return (time.perf_counter() - t0) / iters, iters

    def gather(self, value: float) -> list[float]:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        out = [torch.zeros_like(t) for _ in range(self.n)]
        dist.all_gather(out, t, group=self.group)
        return [x.item() for x in out]

    def compute_gflops(self) -> float:
        """This rank's matmul speed: what a straggler check compares."""
        cuda = self.device.type == "cuda"
        rate = matmul_flops(4096 if cuda else 384, torch.bfloat16 if cuda else torch.float32, self.device,
                            seconds=self.budget_s, min_reps=3)
        return rate.mean / 1e9  # sustained, not the best single one: a straggler is slow on average


def join_job() -> torch.device:
    """Start this worker's process group (NCCL on CUDA devices, gloo on CPU); returns its device."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", required=True, help="comma-separated byte counts")
    p.add_argument("--ops", default=",".join(BENCH_OPS))
    p.add_argument("--budget", type=float, default=0.1, help="seconds of timed iterations per point")
    p.add_argument("--max-iters", type=int, default=50)
    args = p.parse_args()

    device = join_job()
    bench = Bench(device, args.budget, args.max_iters)
    ops = [op for op in args.ops.split(",") if op != "sendrecv" or bench.n > 1]
    results = []
    for op in ops:
        for size in (int(s) for s in args.sizes.split(",")):
            call, nbytes = bench.buffers(op, size)
            seconds, iters = bench.time(call)
            results.append({"op": op, "size": nbytes, "iters": iters, "times": bench.gather(seconds)})
            del call  # free this size's buffers before the next
    gflops = bench.gather(bench.compute_gflops())
    if bench.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": bench.n, "backend": dist.get_backend(), "device": device.type,
                       "results": results, "compute_gflops": gflops}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_worker(0)
