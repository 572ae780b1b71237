"""The workers of `shoal train --nproc 2` die with their launcher however it dies (SIGKILL: the
kernel's parent-death signal; SIGINT: one line, exit 130; SIGTERM: a checkpoint of the step they
stop after, one line, exit 75), and a second run into the same --out is refused while the first one lives."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, shoal_cli, shoal_here
from shoal.rundir.metrics import read_rows
from shoal.testing.processes import cmdline, worker, workers as training_workers

pytestmark = pytest.mark.timeout(180)

RUN = ["--set", "model.preset=debug", "--set", "train.steps=100000", "--set", "train.micro_batch=4",
       "--set", "train.global_batch=8", "--set", "train.seq_len=64", "--set", "train.eval_every=0",
       "--set", "train.eval_batches=1", "--set", "train.sample_tokens=0", "--quiet"]


def alive(pid: int) -> bool:
    return bool(cmdline(pid))  # a zombie has no cmdline: it is dead, its parent just has not reaped it


def start_training(out: Path, extra: list[str] = ()) -> tuple[subprocess.Popen, list[int]]:
    """A 2-worker run, once both workers are training (a metrics row is written)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launcher = subprocess.Popen([sys.executable, "-m", "shoal", "train", *RUN, *extra, "--nproc", "2", "--out", str(out)],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not read_rows(out):
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            pytest.fail("the run never started: " + launcher.communicate()[1][-3000:])
        time.sleep(0.1)
    workers = training_workers(launcher.pid)
    # forked from the launcher's forkserver (shoal/launch/forked.py), each titled with its rank
    assert sorted(cmdline(p).rsplit(" (", 1)[-1] for p in workers) == [f"rank {r} of 2, restart 0)" for r in (0, 1)]
    return launcher, workers


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_workers_die_with_their_launcher(sig, tmp_path, capsys):
    out = tmp_path / "run"
    launcher, workers = start_training(out)
    try:
        if sig == "SIGKILL":  # while it lives, its directory is its own
            r = shoal_here(capsys, "train", *RUN, "--out", str(out))
            assert r.returncode == 2 and f"in use by a running shoal train (pid {launcher.pid}" in r.stderr, r.stderr
        launcher.send_signal(getattr(signal, sig))
        code = launcher.wait(timeout=60)
        assert gone_within(workers, 10), f"orphaned workers after {sig}: {[p for p in workers if alive(p)]}"
    finally:
        launcher.kill()
        for p in workers:
            if alive(p):
                os.kill(p, signal.SIGKILL)
    err = launcher.stderr.read()
    if sig == "SIGKILL":
        assert code == -signal.SIGKILL
    elif sig == "SIGTERM":  # preemption: every rank stops after the same step and saves it (shoal/train/preempt.py)
        lines = err.strip().splitlines()
        assert code == 75 and len(lines) == 1 and lines[0].startswith("shoal train: stopped by SIGTERM after step"), err
        step = int(lines[0].split("after step ")[1].split(";")[0])
        assert [p.name for p in (out / "checkpoints").glob("step_*")] == [f"step_{step:08d}"], err
        assert read_rows(out)[-1]["step"] == step
    else:
        assert code == 128 + getattr(signal, sig), (code, err)
        assert err.strip().splitlines() == [f"shoal: stopped by {sig}; all 2 workers were stopped"], err


def test_a_run_refused_after_its_forkserver_started_leaves_nothing(tmp_path):
    """The workers' forkserver starts once the layout is checked, beside the checks after it
    (shoal/launch/forkserver_start.py). A mistake one of those finds (here a corpus shorter than a batch)
    is still one line and exit code 2, and the forkserver goes with the launcher, its folder with it."""
    (tmp_path / "tiny.txt").write_text("hello")
    temp = tmp_path / "tmp"
    temp.mkdir()
    r = shoal_cli("train", *RUN, "--set", f"data.path={tmp_path / 'tiny.txt'}", "--nproc", "2",
                  "--out", str(tmp_path / "run"), env={"TMPDIR": str(temp)})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("shoal train: error: data.path="), r.stderr
    deadline = time.monotonic() + 10
    while list(temp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(temp.iterdir()) == [] and not (tmp_path / "run").exists()


def test_a_nonfinite_loss_in_the_workers_is_one_line(tmp_path):
    """Every rank stops at the same step (no rank left waiting); rank 0 alone says why; exit code 3."""
    r = shoal_cli("train", *RUN, "--set", "train.steps=6", "--set", "train.lr=1e30", "--set", "checkpoint.every=1",
                  "--nproc", "2", "--out", str(tmp_path / "run"), timeout=120)
    errors = [line for line in r.stderr.splitlines() if "error" in line or "failed" in line]
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert len(errors) == 1 and "stopping before it reaches a checkpoint" in errors[0], r.stderr
    step = int(errors[0].split("step ")[1].split(":")[0])
    saved = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert max(saved, default=0) == step - 1 and not (tmp_path / "run" / "model").exists()  # the last good step


@pytest.mark.parametrize("watchdog, rank", [(True, 1), (False, 1), (True, 0)])
def test_a_worker_killed_from_outside_is_named_without_a_traceback(tmp_path, watchdog, rank):
    """kill -9 on one worker (the OOM killer, a scheduler): the launcher names that worker and the
    signal, and the surviving rank says it lost a peer (the hang report naming the dead rank, or
    without the watchdog its own line) instead of a traceback from inside the collective. Rank 0
    hosts the job's store, so its survivor has no store to report through (docs/debugging.md): the
    launcher's line is what is said (the survivor's own account too, when its collective fails before
    the launcher stops it), without the store client's C++ stack for each reconnect."""
    launcher, workers = start_training(tmp_path / "run", [] if watchdog else ["--set", "debug.hang_timeout_s=0"])
    victim = worker(launcher.pid, rank)
    os.kill(victim, signal.SIGKILL)
    _, err = launcher.communicate(timeout=90)
    assert launcher.returncode == 1 and "Traceback" not in err and "frame #" not in err, err[-4000:]
    assert f"worker rank {rank} was killed by SIGKILL (exit code -9), from outside shoal" in err, err[-4000:]
    if rank == 0:
        assert gone_within(workers, 10)
        return
    said = f"rank {1 - rank} stopped: a peer is gone" in err
    if watchdog:  # its hang report names the dead rank, unless the survivor's collective failed outside its view
        said = said or f"rank {rank}: DEAD" in err
    assert said, err[-4000:]
    assert gone_within(workers, 10)
