"""Context parallelism on CPU (gloo loopback): speed at one length, and the length that fits a memory bound.

    python bench/bench_context_parallel.py [--speed-len 2048] [--fit-len 1024] [--lengths 512,...] [--out DIR]

1. Speed: tokens/s of cp=2 on 2 ranks against one rank at the same sequence length (median of the
   steady steps, from the runs' metrics.jsonl). On CPU two ranks also have two processes' cores, so
   the ratio is cp's compute split minus its key/value traffic and the chunked attention's overhead.
2. Length: each cp in 1, 2, 4 trains each length of --lengths for 2 steps; a rank's memory is what
   the run itself measures (metrics.jsonl's memory_by_rank: parameters, gradients, optimizer state
   and the activations autograd saved on the first step, exact byte counts), the largest over its
   ranks. The bound is what one rank needs at --fit-len, rounded up to a whole MiB (or --bound-mib);
   the table shows the longest length each cp fits in it, and the check: cp=4 trains 4 x the longest
   one rank fits, within the bound. Ranks replicate the model (zero=0), so only activations shrink.
   The peak resident set (RSS, which on CPU also holds Python, torch and transient buffers such as the
   gathered keys and values) is printed beside it.
All runs of one rank count share one launch of its workers.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATE = ("params", "grads", "optimizer", "activations")


def settings(a, seq_len: int, cp: int, steps: int) -> list[str]:
    return [f"model.preset={a.model}", f"model.max_seq_len={max(seq_len, 256)}", f"train.steps={steps}",
            f"train.seq_len={seq_len}", "train.global_batch=1", "train.micro_batch=1", "train.eval_every=0",
            "train.eval_batches=1", "train.sample_tokens=0", "train.memory_check=false", "train.warmup_steps=1",
            f"parallel.cp={cp}", "parallel.dp_shard=1", "parallel.zero=0"]


def worker(out: Path, runs: list[tuple[str, list[str]]]) -> None:
    from shoal.config import load_config
    from shoal.train.distributed import shutdown
    from shoal.train.trainer import train

    for name, sets in runs:
        train(load_config(None, sets), out / name, show=False, keep_process_group=True)
    shutdown()


def launch(out: Path, nproc: int, runs: list[tuple[str, list[str]]]) -> None:
    runs = [(name, sets) for name, sets in runs if not (out / name / "model").exists()]  # done before: read
    if not runs:
        return
    code = (f"import sys; from shoal.launch.local import launch; "
            f"sys.exit(launch({[__file__, '--worker', str(out), json.dumps(runs)]!r}, {nproc}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    if r.returncode:
        raise SystemExit(r.stdout[-2000:] + r.stderr[-3000:])


def summary(out: Path, name: str) -> dict:
    from shoal.rundir.metrics import read_rows

    rows = read_rows(out / name)
    by_rank = next(r["memory_by_rank"] for r in rows if "memory_by_rank" in r)
    per_rank = [sum(by_rank[k][i] or 0 for k in STATE) for i in range(len(by_rank["params"]))]
    steady = rows[2:] or rows[1:] or rows  # past the first step (it measures activations) and the warm-up
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady), "memory": max(per_rank),
            "activations": max(by_rank["activations"]), "rss": max(by_rank["peak"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="debug")
    p.add_argument("--speed-len", type=int, default=2048)
    p.add_argument("--speed-steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fit-len", type=int, default=1024,
                   help="the bound is one rank's memory at this length, rounded up to a MiB (or --bound-mib)")
    p.add_argument("--bound-mib", type=float, default=0)
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--out", default="", help="keep the runs here (default: a temporary directory)")
    p.add_argument("--worker", nargs=2, metavar=("OUT", "RUNS_JSON"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(Path(a.worker[0]), json.loads(a.worker[1]))
    out = Path(a.out or tempfile.mkdtemp(prefix="shoal-bench-cp-"))
    lengths = sorted({int(x) for x in a.lengths.split(",")} | {a.fit_len})
    for cp in (1, 2, 4):
        # up to twice what cp x one rank's length would need: one length past the bound for each cp
        launch(out, cp, [(f"len{n}-cp{cp}", settings(a, n, cp, 2)) for n in lengths if n % (2 * cp) == 0
                         and n <= 2 * cp * a.fit_len])
    # Speed: the two alternate, --repeats times (a shared machine's load moves in between); medians.
    speed = {cp: [f"speed{a.speed_len}-cp{cp}-{i}" for i in range(a.repeats)] for cp in (1, 2)}
    for i in range(a.repeats):
        for cp in (1, 2):
            launch(out, cp, [(speed[cp][i], settings(a, a.speed_len, cp, a.speed_steps))])

    def median_of(cp: int) -> dict:
        runs = [summary(out, name) for name in speed[cp]]
        return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    one, two = median_of(1), median_of(2)
    print(f"{a.model} model on CPU (gloo loopback), sequence {a.speed_len}, batch 1, median of {a.repeats} "
          f"alternating runs")
    print(f"{'':<18}{'tokens/s':>10}{'ratio':>8}{'memory/rank':>14}{'ratio':>8}")
    for label, s in (("1 rank", one), ("cp=2 on 2 ranks", two)):
        print(f"{label:<18}{s['tokens_per_s']:>10,.0f}{s['tokens_per_s'] / one['tokens_per_s']:>7.2f}x"
              f"{s['memory'] / 2**20:>10.1f} MiB{s['memory'] / one['memory']:>7.2f}x")

    found = {(n, cp): summary(out, f"len{n}-cp{cp}") for n in lengths for cp in (1, 2, 4)
             if (out / f"len{n}-cp{cp}" / "model").exists()}
    bound = a.bound_mib * 2**20 if a.bound_mib else math.ceil(found[a.fit_len, 1]["memory"] / 2**20) * 2**20
    print(f"\nmemory bound: {bound / 2**20:.0f} MiB per rank (" + ("--bound-mib" if a.bound_mib else
          f"what one rank needs at {a.fit_len} tokens, rounded up to a MiB") + "; memory = parameters, gradients, "
          "optimizer state and saved activations, as the runs measure them)")
    print(f"{'length':>8}" + "".join(f"{f'cp={cp} MiB':>13}{'RSS':>9}" for cp in (1, 2, 4)))
    for n in lengths:
        cells = ""
        for cp in (1, 2, 4):
            s = found.get((n, cp))
            cells += (f"{s['memory'] / 2**20:>11.1f}{'*' if s['memory'] <= bound else ' ':<2}{s['rss'] / 2**20:>9.0f}"
                      if s else f"{'-':>13}{'':>9}")
        print(f"{n:>8}{cells}")
    longest = {cp: max((n for n in lengths if (n, cp) in found and found[n, cp]["memory"] <= bound), default=0)
               for cp in (1, 2, 4)}
    print("* fits the bound. longest that fits: " + ", ".join(
        f"cp={cp} {longest[cp]} ({longest[cp] / max(1, longest[1]):.0f}x)" for cp in (1, 2, 4)))
    four = found.get((4 * longest[1], 4))
    if four:
        print(f"check: cp=4 trains {4 * longest[1]} tokens (4 x one rank's {longest[1]}) in "
              f"{four['memory'] / 2**20:.1f} MiB per rank, {'within' if four['memory'] <= bound else 'OVER'} the "
              f"{bound / 2**20:.1f} MiB bound")
    print(f"runs: {out}")


if __name__ == "__main__":
    main()
