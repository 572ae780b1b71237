"""train.compile on CPU: tokens/s of the compiled step over the eager one, same model and batch.

    python bench/bench_compile.py [--preset tiny] [--seq-len 256] [--micro-batch 4] [--steps 10]

Runs the trainer's step (bench/gpu_mfu.py's Runner: parallelize, forward_backward, clipping,
AdamW) eager, then compiled (inductor's C++ backend), and prints both, the ratio, and how long the
compiled variant's warm-up steps took (the compilation, unless inductor's on-disk cache had it).
Eager and compiled alternate twice and the better of each is kept, so a busy machine hurts both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from gpu_mfu import Runner, job_for, measure  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--recompute", default="none")
    args = p.parse_args(argv)
    device = torch.device("cpu")
    runners, first = {}, {}
    for compiled in (False, True):
        job = job_for([f"model.preset={args.preset}"], args.seq_len, args.micro_batch, args.recompute, compiled, "fp32")
        runners[compiled] = Runner(job, device)
        t0 = time.perf_counter()
        measure(runners[compiled], args.micro_batch, steps=1, warmup=2)  # compiles (train graph) on the first
        first[compiled] = time.perf_counter() - t0
    best = {False: float("inf"), True: float("inf")}
    for _ in range(2):
        for compiled in (False, True):
            step_s, _ = measure(runners[compiled], args.micro_batch, args.steps, warmup=1)
            best[compiled] = min(best[compiled], step_s)
    tokens = args.micro_batch * args.seq_len
    eager, compiled = tokens / best[False], tokens / best[True]
    print(f"{args.preset}, seq {args.seq_len}, micro-batch {args.micro_batch}, recompute={args.recompute}, "
          f"{torch.get_num_threads()} threads")
    print(f"eager:    {eager:10,.0f} tokens/s  (first 3 steps {first[False]:.1f} s)")
    print(f"compiled: {compiled:10,.0f} tokens/s  (first 3 steps {first[True]:.1f} s, compilation included)")
    print(f"compiled/eager: {compiled / eager:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
