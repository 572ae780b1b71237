"""The run summary: steady-state throughput (warm-up steps left out) and the planner's memory beside the measured."""

from pathlib import Path

import pytest

from shoal.config import load_config
from shoal.train.metrics import WARMUP_STEPS, MetricsLog


def _log(tmp_path, times):
    log = MetricsLog(tmp_path / "m.jsonl", enabled=False)
    for i, t in enumerate(times):
        log.write({"step": i + 1, "step_time_s": t})
    return log


def test_steady_step_time_leaves_out_the_warm_up(tmp_path):
    assert WARMUP_STEPS == 2
    assert _log(tmp_path, [5.0, 2.0, 1.0, 1.0, 1.0]).steady_step_time() == (1.0, 2)
    assert _log(tmp_path, [5.0, 1.0]).steady_step_time() == (3.0, 0)  # too short: every step, and it says so


def test_summary_reports_steady_throughput_and_predicted_memory(tmp_path):
    from shoal.train.trainer import train

    cfg = load_config(str(Path(__file__).parents[2] / "recipes/debug.toml"), ["train.steps=4", "train.sample_tokens=0", "train.eval_batches=1",
                                              "train.seq_len=32", "train.global_batch=4"])
    summary = train(cfg, tmp_path / "run", show=False)
    assert summary["tokens/s (without 2 warm-up steps)"] > 0
    assert not any(k == "tokens/s" for k in summary)
    measured, predicted = summary["peak memory (GiB, rank 0)"], summary["predicted peak memory (GiB, planner)"]
    # CPU: the measured peak is the process's resident set (interpreter + torch), which the planner's
    # 0.3 GiB runtime allowance stands for; the debug model itself is a few MiB.
    assert predicted == pytest.approx(measured, rel=0.6), (predicted, measured)
