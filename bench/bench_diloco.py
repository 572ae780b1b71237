"""DiLoCo and Streaming DiLoCo beside plain data parallelism: bench_compression.py's model, seeds,
tokens and settings, with two replica groups of one rank each (dp_replicate=2).

    python bench/bench_diloco.py [--steps 5400] [--seeds 0 1 2] [--methods diloco50,...]

The default 5400 steps (13 tokens per parameter, about 2.3 min a run on 2 CPU cores) is the
shortest of the lengths measured (600, 1800, 3600, 5400, 8100) in which DiLoCo H=50 stays within
5% of plain DDP; shorter runs are still in the fast first phase, where each group's half batch
costs most (docs/slow_links.md).

Prints, paired by seed against plain DDP (grad_compression=none): the final eval-loss gap and the
cross-group bytes one rank sent, averaged over every step of the run (DiLoCo sends once per H
steps, so a per-step mean over steady steps would miss or over-count the syncs), and their ratio.
Every run ends on an outer step of all fragments, so the evaluated model is the groups' common one.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_compression as bc  # noqa: E402  (a sibling script, not a package)

DILOCO = ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=0.7", "parallel.diloco_outer_momentum=0.9"]
# Less outer momentum did better here (a 600-step run has only 12 outer steps; seed 0, lr 1: momentum
# 0 +7.8%, 0.3 +7.6%, 0.5 +7.2%, 0.9 +13.2%; lr 0.5 momentum 0.8 +8.6%)
LOW_MOMENTUM = ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0.5"]
METHODS = {  # name -> settings, beside bench_compression's "none"
    "diloco50": DILOCO,  # the paper's outer lr 0.7, Nesterov 0.9
    "diloco50-m0.5": LOW_MOMENTUM,
    "diloco50-m0.5-int8": LOW_MOMENTUM + ["parallel.diloco_quantize=int8"],
    "stream50x5-m0.5": LOW_MOMENTUM + ["parallel.diloco_fragments=5"],
    "stream50x5-m0.5-int8": LOW_MOMENTUM + ["parallel.diloco_fragments=5", "parallel.diloco_quantize=int8"],
    # overlapped: each fragment's all-reduce runs beside the next step (tau = 1), or the whole model's
    # beside the next five; landed mixed half and half (parallel/diloco.py)
    "stream50x5-m0.5-tau1": LOW_MOMENTUM + ["parallel.diloco_fragments=5", "parallel.diloco_overlap_steps=1"],
    "diloco50-m0.5-tau5": LOW_MOMENTUM + ["parallel.diloco_overlap_steps=5"],
    # how the gap grows with H at plain model averaging (outer lr 1, momentum 0): H=1 is the floor,
    # AdamW on each group's half batch and the parameters averaged after every step (1800 steps, seeds 0-2:
    # H=1 -0.3%, H=10 +1.8%, H=50 +7.8%; plain DDP on batch 4 alone, 1800 steps, is +7.9%)
    **{f"avg{h}": [f"parallel.diloco_inner_steps={h}", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0"]
       for h in (1, 10, 50)},
    # each group trains on half the batch: AdamW's square-root rule for half the batch (lr / sqrt 2), and lr / 2.
    # 1800 steps, seeds 0-2: +4.1% and +2.4% against plain DDP at 3e-3, but +6.9% and +6.0% against plain DDP
    # at the same lr (ddp-lr*), which is itself 2.6% and 3.4% better than at 3e-3: the baseline's lr, not DiLoCo
    "avg50-lr0.71x": ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0",
                      "train.lr=0.0021213"],
    "avg50-lr0.5x": ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0",
                     "train.lr=0.0015"],
    # the fairness check for the two above: plain DDP (no DiLoCo) at the lower learning rates
    "ddp-lr0.71x": ["train.lr=0.0021213"],
    "ddp-lr0.5x": ["train.lr=0.0015"],
    # the gap opens in the first ~200 steps, at peak lr: a 200-step lr warm-up, beside plain DDP with the same.
    # 1800 steps, seeds 0-2: -0.2% against plain DDP as benched, +6.1% against ddp-wu200 (itself 5.9% better)
    "avg50-wu200": ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0",
                    "train.warmup_steps=200"],
    "ddp-wu200": ["train.warmup_steps=200"],
    # 50x fewer bytes from both levers at once: syncs every 13 steps with an int8 pseudo-gradient (~3.9x)
    "avg13-int8": ["parallel.diloco_inner_steps=13", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0",
                   "parallel.diloco_quantize=int8"],
    # 4 bits (a sign and a power of two, Streaming DiLoCo's E3M0 with a zero): ~7.8x, so H=7 is 54x
    "avg7-fp4": ["parallel.diloco_inner_steps=7", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0",
                 "parallel.diloco_quantize=fp4"],
    "avg13-int8-lr1.2": ["parallel.diloco_inner_steps=13", "parallel.diloco_outer_lr=1.2", "parallel.diloco_outer_momentum=0",
                         "parallel.diloco_quantize=int8"],
    "stream50x5-avg-tau1": ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0",
                            "parallel.diloco_fragments=5", "parallel.diloco_overlap_steps=1"],
    # inner lr 2e-3 with outer lr 1.5: the same step in a straight line as lr 3e-3 averaged, with less drift
    # between syncs. 1800 steps, seeds 0-2: +3.3%, but plain averaging at the same inner lr is +2.3% and
    # plain DDP at 2e-3 is 2.8% better than at 3e-3: the inner lr again, and the outer lr 1.5 costs a point
    "avg50-lr2e-3-outer1.5": ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=1.5",
                              "parallel.diloco_outer_momentum=0", "train.lr=2e-3"],
    "avg50-lr2e-3": ["parallel.diloco_inner_steps=50", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0",
                     "train.lr=2e-3"],
    "ddp-lr2e-3": ["train.lr=2e-3"],
    "diloco13-m0.5-int8": ["parallel.diloco_inner_steps=13", "parallel.diloco_outer_lr=1",
                           "parallel.diloco_outer_momentum=0.5", "parallel.diloco_quantize=int8"],
}
bc.METHODS.update(METHODS)  # bc.settings() reads it
HEADLINE = ["diloco50", "diloco50-m0.5", "stream50x5-m0.5-tau1"]  # what runs without --methods


def summarize(out: Path, name: str) -> dict:
    from shoal.rundir.metrics import read_rows

    rows = read_rows(out / name)
    per_step = [sum(r["comm_bytes"].values()) for r in rows]
    # peak: the most one step sends, leaving out the last, which syncs every fragment at once
    return {"eval_loss": rows[-1]["eval_loss"], "sent": statistics.mean(per_step), "peak": max(per_step[:-1]),
            "dtypes": sorted({k for r in rows for k in r["comm_bytes_by_dtype"]})}


def main() -> None:
    a = bc.arguments(__doc__, HEADLINE, steps=5400).parse_args()
    methods = ["none"] + [m for m in a.methods.split(",") if m != "none"]
    out = Path(a.out or tempfile.mkdtemp(prefix="shoal-bench-diloco-"))
    results = bc.run_all(a, out, methods, summarize)
    tokens = a.steps * a.global_batch * a.seq_len
    print(f"{a.model} model, {a.nproc} replica groups (gloo loopback), {a.steps} steps = {tokens:,} tokens, "
          f"seeds {a.seeds}; gap paired by seed; bytes: what one rank sends per step, mean over all steps")
    print(f"{'method':<22}{'eval loss':>10}{'gap':>9}{'bytes/step':>12}{'fewer':>8}{'peak/step':>11}  on the wire")
    for m in methods:
        rs = [results[m, s] for s in a.seeds]
        gaps = [results[m, s]["eval_loss"] / results["none", s]["eval_loss"] - 1 for s in a.seeds]
        fewer = [results["none", s]["sent"] / results[m, s]["sent"] for s in a.seeds]
        print(f"{m:<22}{statistics.mean(r['eval_loss'] for r in rs):>10.4f}{statistics.mean(gaps):>+9.2%}"
              f"{statistics.mean(r['sent'] for r in rs):>12,.0f}{statistics.mean(fewer):>7.1f}x"
              f"{statistics.mean(r['peak'] for r in rs):>11,.0f}  {', '.join(rs[0]['dtypes'])}")
    print(f"runs: {out}")


if __name__ == "__main__":
    main()
