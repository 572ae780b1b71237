"""How long `shoal train --nproc N` takes to start and finish a short run, and the CPU it burns, with
workers forked from a preloaded forkserver (the default) against workers started as fresh interpreters
(SHOAL_FORK_WORKERS=0), side by side.

    python bench/bench_launch.py [--nproc 2 4] [--steps 3] [--repeat 2]

CPU is the whole process tree's user+system time: this process becomes a subreaper (prctl), so the
forkserver and any worker orphaned at the end are reaped here and counted. The two ways alternate and
the better of each is kept, so a busy machine hurts both.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PR_SET_CHILD_SUBREAPER = 36


def run(nproc: int, steps: int, forked: bool) -> tuple[float, float]:
    """(wall s, CPU s of every process the run started) of one short run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory(prefix="shoal-bench-launch-") as out:
        cmd = [sys.executable, "-m", "shoal", "train", "recipes/debug.toml", "--nproc", str(nproc), "--quiet",
               "--set", f"train.steps={steps}", "--set", "train.micro_batch=2", "--set", "train.global_batch=8",
               "--set", "train.sample_tokens=0", "--set", "checkpoint.every=0",
               "--out", str(Path(out) / "run")]
        env = dict(os.environ, SHOAL_FORK_WORKERS="1" if forked else "0", PYTHONPATH=str(REPO))
        t0 = time.perf_counter()
        code = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t0
    if code.returncode:
        sys.exit(f"bench_launch: {' '.join(cmd)} exited {code.returncode}:\n{code.stderr[-2000:]}")
    while True:  # the orphans this subreaper inherited (the forkserver, killed when its launcher left)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    print(f"shoal train recipes/debug.toml, {args.steps} steps, best of {args.repeat}, {os.cpu_count()} cores")
    print(f"{'ranks':>5}  {'exec wall':>9}  {'forked wall':>11}  {'ratio':>5}  {'exec CPU':>8}  {'forked CPU':>10}  {'ratio':>5}")
    for nproc in args.nproc:
        best = {True: (float("inf"), float("inf")), False: (float("inf"), float("inf"))}
        for _ in range(args.repeat):
            for forked in (False, True):
                wall, cpu = run(nproc, args.steps, forked)
                best[forked] = (min(best[forked][0], wall), min(best[forked][1], cpu))
        (ew, ec), (fw, fc) = best[False], best[True]
        print(f"{nproc:>5}  {ew:>8.1f}s  {fw:>10.1f}s  {fw / ew:>5.2f}  {ec:>7.1f}s  {fc:>9.1f}s  {fc / ec:>5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
