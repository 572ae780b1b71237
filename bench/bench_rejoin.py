"""What fault-tolerant replica groups cost per step, and what a group dropping out costs in loss.

    flock /tmp/shoal-cpu.lock python bench/bench_rejoin.py [--only collective|training] [--steps 800]
                                                           [--kill-at 100] [--seeds 0 1]

0. The collective alone: a 2-rank gloo all_reduce of the debug model's gradient size vs the same
   all-reduce through torchft (start_quorum + Manager.allreduce + should_commit, 2 groups of 1).
1. Per step: plain DDP on 2 ranks (`shoal train --nproc 2`) vs 2 replica groups of 1 rank each
   (`--replica-groups 2`, torchft: quorum + cross-group all-reduce + should_commit), same recipe,
   same batch. Mean step time over the steps after the first 20, side by side, with torchft's parts.
2. Final eval loss: uninterrupted vs group 1's worker killed at step --kill-at (it restarts, rejoins
   from group 0's live state), for each seed; the paired gap beside the seed-to-seed spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shoal.rundir.metrics import read_rows  # noqa: E402
from shoal.testing.replica_kill import run_replica_groups  # noqa: E402

RECIPE = str(REPO / "recipes" / "debug.toml")
SKIP = 20  # start-up and the first quorums


def overrides(steps: int, seed: int) -> list[str]:
    return [f"train.steps={steps}", "train.eval_every=0", "train.eval_batches=8", "train.sample_tokens=0",
            f"train.seed={seed}"]


def mean(rows: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rows[SKIP:])


def plain_ddp(out: Path, steps: int, seed: int) -> list[dict]:
    cmd = [sys.executable, "-m", "shoal", "train", RECIPE, "--nproc", "2", "--out", str(out), "--quiet",
           *[f"--set={o}" for o in overrides(steps, seed)]]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return read_rows(out)


def _plain_all_reduce(rank: int, n: int, iters: int, port: int, times) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    grad = torch.randn(n)
    for i in range(iters):
        t0 = time.perf_counter()
        dist.all_reduce(grad)
        grad /= 2
        times[rank * iters + i] = time.perf_counter() - t0
    dist.destroy_process_group()


def _torchft_all_reduce(group: int, n: int, iters: int, lighthouse: str, times) -> None:
    import torch
    import torchft
    from shoal.parallel.replicas import COLLECTIVE_TIMEOUT, MANAGER_TIMEOUT

    store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    # The settings shoal/parallel/replicas.py uses.
    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(timeout=COLLECTIVE_TIMEOUT), load_state_dict=lambda s: None,
                              state_dict=lambda: {}, min_replica_size=1, use_async_quorum=False,
                              timeout=MANAGER_TIMEOUT, quorum_timeout=MANAGER_TIMEOUT, rank=0, world_size=1,
                              replica_id=f"bench_{group}", init_sync=False, store_addr="localhost",
                              store_port=store.port, lighthouse_addr=lighthouse)
    grad = torch.randn(n)
    while True:  # both groups in the quorum before timing
        manager.start_quorum()
        if manager.num_participants() == 2:
            break
        time.sleep(0.1)
    for i in range(iters):
        t0 = time.perf_counter()
        manager.start_quorum()
        t1 = time.perf_counter()
        manager.allreduce(grad).wait()
        t2 = time.perf_counter()
        manager.should_commit()
        t3 = time.perf_counter()
        times[(group * iters + i) * 3:(group * iters + i) * 3 + 3] = [t1 - t0, t2 - t1, t3 - t2]
    manager.shutdown(wait=False)


def collective_cost(iters: int, port: int) -> None:
    import torch.multiprocessing as mp

    from shoal.config import load_config
    from shoal.model.analytics import param_counts
    from shoal.parallel.replicas import import_torchft

    n = param_counts(load_config(RECIPE, []).model_config()).total
    ctx = mp.get_context("spawn")
    os.environ["OMP_NUM_THREADS"] = "1"
    plain = ctx.Array("d", 2 * iters, lock=False)
    procs = [ctx.Process(target=_plain_all_reduce, args=(r, n, iters, port, plain)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    import_torchft()
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=10_000, heartbeat_timeout_ms=1_000)
    ft = ctx.Array("d", 2 * iters * 3, lock=False)
    procs = [ctx.Process(target=_torchft_all_reduce, args=(g, n, iters, lighthouse.address(), ft)) for g in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    lighthouse.shutdown()
    skip = iters // 10
    plain_ms = statistics.median(plain[skip:]) * 1e3
    parts = [statistics.median(ft[k::3][skip:]) * 1e3 for k in range(3)]
    print(f"the collective alone: {n:,} fp32 gradient elements, 2 processes, median of {iters - skip} iterations")
    print(f"  gloo all_reduce (plain DDP's collective):     {plain_ms:7.3f} ms")
    print(f"  torchft quorum + all-reduce + should_commit:  {sum(parts):7.3f} ms   ratio {sum(parts) / plain_ms:.2f}x")
    print(f"    quorum {parts[0]:.3f} ms, all-reduce {parts[1]:.3f} ms, should_commit {parts[2]:.3f} ms\n")


def final_eval(rows: list[dict]) -> float:
    return rows[-1]["eval_loss"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--kill-at", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--only", choices=["collective", "training"],
                    help="collective: part 0 alone; training: parts 1 and 2 (they share runs); default: all")
    ap.add_argument("--iters", type=int, default=300, help="iterations of the collective alone")
    ap.add_argument("--port", type=int, default=33100, help="free TCP port for the plain gloo group")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rejoin-bench-"))
    if args.only != "training":
        collective_cost(args.iters, args.port)
    if args.only != "collective":
        training(args, tmp)


def training(args, tmp: Path) -> None:
    ddp = plain_ddp(tmp / "ddp", args.steps, args.seeds[0])
    whole = {s: run_replica_groups(RECIPE, tmp / f"whole-{s}", overrides(args.steps, s)) for s in args.seeds}
    g0 = whole[args.seeds[0]].rows[0]
    print(f"per step ({args.steps} steps, mean after {SKIP}; debug recipe, global batch 8, 2 CPU ranks)")
    print(f"  plain DDP, 2 ranks:              {mean(ddp, 'step_time_s') * 1e3:7.2f} ms")
    print(f"  2 replica groups x 1 (torchft):  {mean(g0, 'step_time_s') * 1e3:7.2f} ms   "
          f"ratio {mean(g0, 'step_time_s') / mean(ddp, 'step_time_s'):.2f}x")
    for key in ("quorum_s", "replica_allreduce_s", "commit_s"):
        print(f"    of which {key[:-2]:<20}  {mean(g0, key) * 1e3:7.2f} ms")
    print(f"  final eval loss: plain DDP {final_eval(ddp):.6f}, replica groups {final_eval(g0):.6f} (same seed)")

    print(f"\nfinal eval loss, group 1's worker SIGKILLed at step {args.kill_at}")
    print("  seed   uninterrupted   killed+rejoined   gap     steps group 0 ran alone")
    base = {}
    for s in args.seeds:
        killed = run_replica_groups(RECIPE, tmp / f"killed-{s}", overrides(args.steps, s), kill_group=1,
                                    kill_at=args.kill_at)
        base[s] = final_eval(whole[s].rows[0])
        k0 = killed.rows[0]
        alone = sum(r["replicas"] == 1 for r in k0)
        print(f"  {s:<6} {base[s]:<15.6f} {final_eval(k0):<17.6f} {(final_eval(k0) / base[s] - 1) * 100:+6.2f}%  {alone}")
    if len(args.seeds) > 1:
        spread = (max(base.values()) - min(base.values())) / min(base.values()) * 100
        print(f"  seed-to-seed spread of the uninterrupted runs: {spread:.2f}%")
    print(f"(runs in {tmp})")


if __name__ == "__main__":
    main()
