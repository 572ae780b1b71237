"""`shoal plan --validate RUN_DIR`: the plan for a run's own layout beside what its metrics.jsonl measured.

The run directories here are written by hand in the trainer's formats (metrics.jsonl rows, a
checkpoint's train_state.json); bench/bench_plan_validate.py does the same on real `shoal train` runs.
"""

import json
import os
import subprocess
import sys

import pytest

from shoal.config import load_config

PROFILE = {"cpu_count": 2, "memory_bytes": 8 * 2**30, "matmul_fp32_flops": 50e9, "matmul_bf16_flops": 5e9,
           "copy_bandwidth": 20e9, "gloo_busbw": 1e9, "gloo_latency": 1e-4}


def write_run(run, step_times, peak=0.5 * 2**30, checkpoint=True, sets=()):
    run.mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for i, t in enumerate(step_times, 1):
            f.write(json.dumps({"step": i, "step_time_s": t, "mfu": 0.1 / t, "peak_mem_bytes": peak}) + "\n")
    if checkpoint:
        cfg = load_config("recipes/tiny.toml", list(sets))
        state = run / "checkpoints" / "step_00000004"
        state.mkdir(parents=True)
        (state / "train_state.json").write_text(json.dumps({"step": 4, "config": cfg.to_dict(),
                                                            "layout": {"world_size": 2}}))


def plan(tmp_path, *args):
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "local_profile.json").write_text(json.dumps(PROFILE))
    env = dict(os.environ, SHOAL_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "shoal", "plan", "--validate", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_validate_reads_config_from_the_checkpoint(tmp_path):
    run = tmp_path / "run"
    write_run(run, [5.0, 3.0, 1.0, 1.2, 0.8], sets=["parallel.zero=1", "train.micro_batch=8"])
    out = plan(tmp_path, str(run), "--json")
    assert out.returncode == 0, out.stderr
    c = json.loads(out.stdout)["validate"]
    assert c["world"] == 2 and c["layout"].startswith("dp2") and "mb8" in c["layout"]
    assert c["steps_measured"] == 3 and c["measured_step_s"] == pytest.approx(1.0)  # warm-up left out; median
    assert c["measured_peak_gib"] == pytest.approx(0.5)
    assert c["step_ratio"] == pytest.approx(c["predicted_step_s"] / 1.0)
    assert c["predicted_mfu"] == pytest.approx(c["measured_mfu"] / c["step_ratio"])
    text = plan(tmp_path, str(run))
    assert text.returncode == 0 and "step (s)" in text.stdout and "peak GiB" in text.stdout


def test_validate_with_the_recipe_when_there_is_no_checkpoint(tmp_path):
    run = tmp_path / "run"
    write_run(run, [1.0] * 4, checkpoint=False)
    out = plan(tmp_path, str(run), "--recipe", "recipes/tiny.toml", "--set", "parallel.tp=2", "--gpus", "2", "--json")
    assert out.returncode == 0, out.stderr
    assert "tp2" in json.loads(out.stdout)["validate"]["layout"]


@pytest.mark.parametrize("make,args,field", [
    (lambda run: None, [], "validate="),  # no such directory
    (lambda run: run.mkdir(), [], "validate="),  # no metrics.jsonl
    (lambda run: write_run(run, [1.0], checkpoint=False), [], "validate="),  # no config anywhere
    (lambda run: write_run(run, [1.0], checkpoint=False), ["--recipe", "recipes/tiny.toml"], "gpus="),
])
def test_validate_bad_input_is_one_line_and_exit_2(tmp_path, make, args, field):
    run = tmp_path / "run"
    make(run)
    out = plan(tmp_path, str(run), *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and field in lines[0], out.stderr


def test_validate_reads_the_prediction_the_run_stored(tmp_path):
    """A run's own prediction (run.json) is what --validate compares; --gpu plans it now instead."""
    import dataclasses

    from shoal.job import resolve
    from shoal.hardware.local import gpu_from_profile
    from shoal.planner.prediction import plan_job

    run = tmp_path / "run"
    write_run(run, [5.0, 3.0, 1.0, 1.2, 0.8], checkpoint=False)
    cfg = load_config("recipes/tiny.toml", ["parallel.zero=1", "train.micro_batch=8"])
    job = resolve(cfg, 2)
    stored = dataclasses.replace(plan_job(job, gpu_from_profile(PROFILE), 2), step_time_s=0.25)  # not what it plans
    (run / "run.json").write_text(json.dumps({"shoal_run": 1, "config": cfg.to_dict(), "model": dataclasses.asdict(job.model),
                                              "layout": dataclasses.asdict(job.layout), "world": 2, "local_world": 2,
                                              "prediction": stored.as_dict()}))
    c = json.loads(plan(tmp_path, str(run), "--json").stdout)["validate"]
    assert c["predicted_step_s"] == 0.25 and c["step_ratio"] == pytest.approx(0.25) and "stored" in c["source"]
    assert c["predicted_peak_gib"] == pytest.approx(stored.memory.total / 2**30)
    now = json.loads(plan(tmp_path, str(run), "--gpu", "local", "--json").stdout)["validate"]
    assert now["predicted_step_s"] != 0.25 and "planned now" in now["source"] and now["layout"] == c["layout"]
    # --gpus-per-node plans anew too (the stored prediction was shown and the flag ignored); --gpus
    # is the run's rank count where it stored none, and another count than it stored is refused
    spread = json.loads(plan(tmp_path, str(run), "--gpus-per-node", "1", "--json").stdout)["validate"]
    assert spread["predicted_step_s"] != 0.25 and "planned now" in spread["source"]
    assert "stored" in json.loads(plan(tmp_path, str(run), "--gpus", "2", "--json").stdout)["validate"]["source"]
    other = plan(tmp_path, str(run), "--gpus", "4")
    assert other.returncode == 2 and other.stderr.strip().splitlines() == [
        "shoal plan: error: gpus=4: the run had 2 ranks (its run.json); --gpus gives that count where a run did not "
        "store it: leave it out, or plan anew without --validate"], other.stderr
