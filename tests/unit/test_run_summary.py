"""The run summary: steady-state throughput (warm-up steps left out) and the planner's prediction beside the measurement."""

from pathlib import Path

import pytest

from shoal.rundir.metrics import WARMUP_STEPS, read_rows, steady


def test_steady_is_the_median_without_each_starts_warm_up():
    """One statistic of a run's speed for the summary, the report and `plan --validate`: the last
    row per step, the first WARMUP_STEPS after each start left out, medians."""
    assert WARMUP_STEPS == 2
    rows = [{"step": s, "step_time_s": t, "tokens_per_s": 100 / t, "mfu": 0.1 / t}
            for s, t in [(1, 9.0), (2, 5.0), (3, 1.0), (4, 2.0), (5, 1.0), (6, 3.0)]]
    fresh = steady(rows)
    assert (fresh.steps, fresh.warmup, fresh.step_time_s, fresh.tokens_per_s) == (4, 2, 1.5, 75.0)
    assert fresh.mfu == pytest.approx(0.075)
    # resumed from step 4: steps 5 and 6 are that start's warm-up; step 3's row is redone after it
    redone = rows + [{"step": 3, "step_time_s": 4.0, "tokens_per_s": 25.0, "mfu": 0.025}]
    again = steady(redone, starts=(0, 4))
    assert (again.steps, again.step_time_s) == (2, 3.0)  # steps 3 (its later row) and 4
    short = steady(rows[:2])  # too short to have steps after the warm-up: all of them, and it says so
    assert (short.steps, short.warmup, short.step_time_s) == (2, 0, 7.0)
    assert steady([]).steps == 0 and steady([]).mfu is None


def test_summary_and_metrics_carry_the_runs_own_prediction(tmp_path):
    """The planner's prediction for the run, computed once before step 1 on this machine's `local`
    profile, is in run.json, beside every metrics.jsonl row, and in the summary with its ratios."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "cache").mkdir()  # a profile, so nothing is measured here
    (tmp_path / "cache" / "local_profile.json").write_text(json.dumps(
        {"cpu_count": 2, "memory_bytes": 8 * 2**30, "matmul_fp32_flops": 50e9, "matmul_bf16_flops": 5e9,
         "copy_bandwidth": 20e9, "gloo_busbw": 1e9, "gloo_latency": 1e-4, "op_overhead": 5e-6}))
    sets = ["train.steps=4", "train.sample_tokens=0", "train.eval_batches=1", "train.seq_len=32", "train.global_batch=4"]
    # A fresh process, as every run is: the planner predicts one, and on CPU the measured peak is the
    # process's resident set, which in the test runner holds whatever earlier tests left (0.7 GiB).
    code = ("import json, sys; from pathlib import Path; from shoal.config import load_config; "
            "from shoal.train.trainer import train; "
            f"s = train(load_config({str(Path(__file__).parents[2] / 'recipes/debug.toml')!r}, {sets!r}), "
            f"Path({str(tmp_path / 'run')!r}), show=False); print(json.dumps(s))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, SHOAL_CACHE_DIR=str(tmp_path / "cache")), cwd=Path(__file__).parents[2])
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["tokens/s (median, without 2 warm-up steps)"] > 0
    assert not any(k == "tokens/s" for k in summary)
    # the summary, the report and `plan --validate` say the same of the run's speed
    from shoal.planner.validate import compare
    from shoal.report.run_figures import steady_measurement
    from shoal.rundir.run import load_run

    assert steady_measurement(load_run(tmp_path / "run"))["step_time_s"] == summary["step time (s, same steps)"]
    assert compare(tmp_path / "run").measured_step_s == summary["step time (s, same steps)"]
    stored = json.loads((tmp_path / "run" / "run.json").read_text())["prediction"]
    assert stored["hardware"] == "local" and stored["step_time_s"] > 0 and 0 < stored["mfu"] < 1
    rows = read_rows(tmp_path / "run")
    assert len(rows) == 4 and all(r["predicted_step_time_s"] == stored["step_time_s"] and r["predicted_mfu"] == stored["mfu"]
                                  and r["predicted_peak_mem_bytes"] == stored["peak_memory_bytes"] for r in rows)
    measured_step, predicted_step = summary["step time (s, same steps)"], summary["predicted step time (s, planner on local)"]
    mfu = next(v for k, v in summary.items() if k.startswith("MFU (model FLOPs"))
    measured_mem, predicted_mem = summary["peak memory (GiB, rank 0)"], summary["predicted peak memory (GiB, planner)"]
    assert predicted_step == stored["step_time_s"] and summary["predicted MFU (same peak)"] == stored["mfu"]
    assert summary["predicted / measured"] == (f"step time {predicted_step / measured_step:.2f}, "
                                               f"MFU {stored['mfu'] / mfu:.2f}, peak memory {predicted_mem / measured_mem:.2f}")
    # CPU: the measured peak is the process's resident set (interpreter + torch), which the planner's
    # runtime allowance stands for; the debug model itself is a few MiB.
    assert predicted_mem == pytest.approx(measured_mem, rel=0.6), (predicted_mem, measured_mem)


def test_the_cpu_peak_is_this_runs():
    """After reset_peak_mem (train calls it first), an earlier peak of the same process (a test
    before, a benchmark's previous run) is not this run's peak."""
    import sys

    import torch

    from shoal.train.memory import peak_mem_bytes, reset_peak_mem

    if not sys.platform.startswith("linux"):
        pytest.skip("the peak resident set restarts through /proc/self/clear_refs")
    cpu = torch.device("cpu")
    big = torch.ones(64 * 2**20)  # 256 MiB, touched
    del big
    high = peak_mem_bytes(cpu)
    reset_peak_mem(cpu)
    assert peak_mem_bytes(cpu) < high - 200 * 2**20
