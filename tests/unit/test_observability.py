"""What a run shows of itself besides metrics.jsonl: the rows handed to TensorBoard and W&B, the
profile summary's time split, and the report's setup block and `shoal plan` reproducer."""

import dataclasses
import json
import os

import pytest

from shoal.config import JobConfig
from shoal.job import resolve
from shoal.train.metric_backends import scalars
from shoal.rundir.profile_summary import read_summaries, time_split, trace_path, write_summary


def test_rows_become_named_scalars_with_one_series_per_rank():
    row = {"step": 7, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.75, "tokens_per_s": 1000.0, "tokens": 4096,
           "comm_bytes": {"all_reduce": 10.0}, "stragglers": [1],
           "memory_by_rank": {"peak": [5.0, None, 7.0], "params": [1.0, 1.0, 1.0]}}
    assert scalars(row) == {"loss": 2.5, "lr": 1e-3, "grad_norm": 0.75, "tokens_per_s": 1000.0, "tokens": 4096.0,
                            "comm_bytes/all_reduce": 10.0, "memory/peak/rank0": 5.0, "memory/peak/rank2": 7.0,
                            "memory/params/rank0": 1.0, "memory/params/rank1": 1.0, "memory/params/rank2": 1.0}


def _op(name, ts, dur, cat="cpu_op", tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 0, "tid": tid}


def test_profile_time_split_counts_communication_compute_and_idle_inside_the_steps(tmp_path):
    events = [_op("ProfilerStep#3", 0, 100, "user_annotation"), _op("ProfilerStep#4", 100, 100, "user_annotation"),
              _op("aten::mm", 10, 30), _op("aten::add", 20, 10),          # nested: 30 us of compute
              _op("c10d::allreduce_", 35, 25),                             # 5 us overlap with mm: communication
              _op("FSDP::all_gather", 120, 40, "user_annotation"),         # FSDP's span holding a gloo wait
              _op("aten::mm", 150, 30),                                    # 10 of its 30 us inside the all-gather
              _op("aten::mm", 190, 30),                                    # 10 us past the last step: left out
              _op("aten::mm", 0, 500, tid=2)]                              # another thread: not the training loop
    split = time_split(events)
    assert split["steps"] == [3, 4] and split["step_us"] == 200
    assert split["comm_us"] == 25 + 40 and split["compute_us"] == 25 + 20 + 10 and split["idle_us"] == 200 - 120
    # With GPU kernels in the trace, the kernels decide and NCCL's are communication.
    gpu = events + [_op("sm80_gemm", 10, 50, "kernel", 7), _op("ncclDevKernel_AllReduce", 60, 20, "kernel", 7)]
    assert time_split(gpu) | {"steps": None} == {"steps": None, "step_us": 200, "compute_us": 50, "comm_us": 20,
                                                 "idle_us": 130, "busy_source": "GPU kernels"}
    # Written beside the trace and read back for the report, by rank.
    for rank in (1, 0):
        trace_path(tmp_path, rank).parent.mkdir(exist_ok=True)
        trace_path(tmp_path, rank).write_text(json.dumps({"traceEvents": events}))
        write_summary(tmp_path, rank, [{"name": "aten::mm", "calls": 3, "self_us": 90.0}])
    (tmp_path / "profile" / "rank2.summary.json").write_text("{")  # a rank killed while writing: left out
    assert [s["rank"] for s in read_summaries(tmp_path)] == [0, 1]

    from shoal.report.run_report import profile_section

    text = " ".join(profile_section(tmp_path).paragraphs) + str(profile_section(tmp_path).table)
    assert "Steps 3, 4 traced on ranks 0, 1" in text and "aten::mm 0.1 ms (3x)" in text
    assert "compute 28%, communication 32%, idle 40%" in text
    assert "debug.profile_steps" in " ".join(profile_section(tmp_path / "none").paragraphs)


def _info(cfg: JobConfig, world: int = 1) -> dict:
    job = resolve(cfg, world)
    return {"config": cfg.to_dict(), "model": dataclasses.asdict(job.model), "layout": dataclasses.asdict(job.layout),
            "world": world, "device": "cpu"}


def test_plan_reproducer_carries_every_model_override_and_the_setup_block_names_the_data():
    from shoal.layout import Layout
    from shoal.report.run_report import _plan_model_flags, setup_rows

    cfg = JobConfig()
    cfg.model.preset, cfg.model.vocab_size, cfg.model.n_layers = "debug", 512, 2
    cfg.data.tokenizer = "/data/tok.json"
    info = _info(cfg)
    assert _plan_model_flags(info) == "--model debug --layers 2 --vocab 512"
    rows = dict(setup_rows(info, Layout(**info["layout"])))
    assert rows["tokenizer"] == "/data/tok.json" and rows["vocabulary"].startswith("512 ids")
    assert rows["batch"].startswith(f"{cfg.train.global_batch} sequences = {cfg.train.global_batch * cfg.train.seq_len:,}")
    assert rows["learning rate"].startswith(f"{cfg.train.lr} peak")


@pytest.mark.parametrize("field,module", [("metrics.tensorboard=true", "tensorboard"), ("metrics.wandb=offline", "wandb")])
def test_a_missing_metrics_library_is_one_line_naming_the_field_and_pip(field, module, monkeypatch):
    import importlib.util

    from shoal.config import load_config
    from shoal.errors import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(UserError) as e:
        load_config(None, [field])
    assert e.value.field == field.split("=")[0] and f"pip install 'shoal[{module}]'" in e.value.fix


def test_wandb_online_without_a_login_is_refused_before_anything_starts(tmp_path, monkeypatch):
    from shoal.config import load_config
    from shoal.errors import UserError

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    (tmp_path / "netrc").write_text("machine example.org login x password y\n")
    with pytest.raises(UserError, match="wandb login"):
        load_config(None, ["metrics.wandb=online"])
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password key\n")
    assert load_config(None, ["metrics.wandb=online"]).metrics.wandb == "online"


def test_a_metrics_backend_that_fails_on_rank_0_after_the_start_is_one_line(tmp_path):
    """Rank 0 alone opens the backends, after the workers started: its refusal (W&B failing to import, or
    refusing a login) was followed by rank 1's 40-line report of the collective that failed for it. A refusing
    rank now leaves its line for its peers too, and they stop without a report (shoal/worker/said.py)."""
    from tests.conftest import shoal_cli

    fake = tmp_path / "fake" / "wandb"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("wandb is broken (a test\'s stand-in)")\n')
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = shoal_cli("train", "recipes/debug.toml", "--nproc", "2", "--set", "metrics.wandb=offline", "--set",
                  "train.steps=2", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "shoal train: error: metrics.wandb='offline': could not start (ImportError: wandb is broken (a test's "
        "stand-in)); fix that, or turn metrics.wandb off"], r.stderr


def test_a_peer_refusal_is_found_in_the_launchers_folder(tmp_path, monkeypatch):
    from shoal.worker.said import SAID_DIR_ENV, a_peer_refused

    assert not a_peer_refused()  # under torchrun no folder is named: nothing to find
    monkeypatch.setenv(SAID_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    (tmp_path / "rank1").write_text("shoal train: error: this rank's own")
    assert not a_peer_refused()
    (tmp_path / "rank0").write_text("shoal train: error: a peer's")
    assert a_peer_refused()
