"""Resharding: a checkpoint written by one layout resumes in another and training continues as if
nothing had changed (within the loss-parity tolerance of `shoal verify`)."""


import pytest

from conftest import shoal_cli, train_here
from shoal.rundir.metrics import read_rows

pytestmark = pytest.mark.timeout(600)

STEPS, TOLERANCE = 6, 1e-4
BASE = ["model.preset=debug", f"train.steps={STEPS}", "train.micro_batch=2", "train.global_batch=8",
        "train.seq_len=64", "train.warmup_steps=2", "train.eval_every=0", "train.eval_batches=1",
        "train.sample_tokens=0", "checkpoint.every=3"]


def train(out, nproc, *overrides, resume="auto"):
    sets = [x for o in BASE + list(overrides) for x in ("--set", o)]
    r = shoal_cli("train", *sets, "--nproc", str(nproc), "--out", str(out), "--resume", resume, "--quiet",
                  timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def losses(out):
    return {row["step"]: row["loss"] for row in read_rows(out)}


def test_dp_shard_4_resumes_as_tp2_pp2_and_on_two_ranks(tmp_path):
    train_here(tmp_path / "one", *BASE, "checkpoint.every=0")  # the uninterrupted single-process reference
    reference = losses(tmp_path / "one")
    train(tmp_path / "fsdp4", 4, "parallel.dp_shard=4")
    saved = losses(tmp_path / "fsdp4")
    assert max(abs(saved[s] - reference[s]) for s in reference) <= TOLERANCE
    step3 = tmp_path / "fsdp4" / "checkpoints" / "step_00000003"

    # The two-rank run also records torch.profiler traces of steps 4-5 on both ranks (debug.profile_steps).
    for name, nproc, layout in [("tp2pp2", 4, ["parallel.tp=2", "parallel.pp=2"]),
                                ("two-ranks-zero1", 2, ["parallel.dp_shard=2", "parallel.zero=1",
                                                        "debug.profile_steps=4-5", "debug.profile_ranks=all"])]:
        r = train(tmp_path / name, nproc, *layout, resume=str(step3))
        assert "resuming from step 3" in r.stderr and "resharded from 4 ranks (dp_shard=4)" in r.stderr, r.stderr
        resumed = losses(tmp_path / name)
        assert sorted(resumed) == [4, 5, 6], name  # continues with the next batch, not from the start
        diff = max(abs(resumed[s] - reference[s]) for s in resumed)
        assert diff <= TOLERANCE, (name, diff, resumed, reference)
    for rank in (0, 1):
        check_trace(tmp_path / "two-ranks-zero1", rank, steps=[4, 5])


def check_trace(out, rank, steps):
    """A Chrome/Perfetto trace of exactly the asked steps, with the ops and collectives run in them."""
    import json

    from shoal.rundir.profile_summary import read_summaries, trace_path

    events = json.loads(trace_path(out, rank).read_text())["traceEvents"]
    marks = sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert marks == [f"ProfilerStep#{s}" for s in steps], marks
    assert any(e.get("name") == "aten::mm" for e in events) and any("c10d" in str(e.get("name")) for e in events)
    summary = next(s for s in read_summaries(out) if s["rank"] == rank)
    assert summary["steps"] == steps and summary["comm_us"] > 0 and summary["compute_us"] > 0
    assert summary["compute_us"] + summary["comm_us"] + summary["idle_us"] == pytest.approx(summary["step_us"])
