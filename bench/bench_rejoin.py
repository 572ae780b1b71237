"""What fault-tolerant replica groups cost per step, and what a group dropping out costs in loss.

    flock /tmp/shoal-cpu.lock python bench/bench_rejoin.py [--steps 800] [--kill-at 100] [--seeds 0 1]

1. Per step: plain DDP on 2 ranks (`shoal train --nproc 2`) vs 2 replica groups of 1 rank each
   (`--replica-groups 2`, torchft: quorum + cross-group all-reduce + should_commit), same recipe,
   same batch. Mean step time over the steps after the first 20, side by side, with torchft's parts.
2. Final eval loss: uninterrupted vs group 1's worker killed at step --kill-at (it restarts, rejoins
   from group 0's live state), for each seed; the paired gap beside the seed-to-seed spread.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shoal.testing.replica_kill import read_rows, run_replica_groups  # noqa: E402

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
    return read_rows(out / "metrics.jsonl")


def final_eval(rows: list[dict]) -> float:
    return rows[-1]["eval_loss"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--kill-at", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rejoin-bench-"))

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
