"""One run, one directory: --out checks, the run lock, metrics that never tear or repeat, the NaN/Inf
guard, resume refusals (finished run, every checkpoint damaged, another run's metrics) and a full disk."""

import errno
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, shoal_cli, shoal_here
from shoal.rundir.metrics import read_rows

STEPS = 4
BASE = ["model.preset=debug", f"train.steps={STEPS}", "train.micro_batch=4", "train.global_batch=8",
        "train.seq_len=64", "train.warmup_steps=2", "train.eval_every=0", "train.eval_batches=1",
        "train.sample_tokens=0", "checkpoint.every=2"]
CLI = ["train", *[x for o in BASE for x in ("--set", o)], "--quiet"]


def run(out, *overrides, resume="auto"):
    from shoal.config import load_config
    from shoal.train.trainer import train

    return train(load_config(None, BASE + list(overrides)), out, show=False, resume=resume)


def steps(out):
    return [r["step"] for r in read_rows(out)]


def one_line(r, code: int, *needles: str) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A finished run: checkpoints at steps 2 and 4, metrics.jsonl, model/."""
    out = tmp_path_factory.mktemp("done")
    run(out)
    return out


def test_out_mistakes_are_one_line_before_anything_is_built(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    one_line(shoal_cli(*CLI, "--out", ""), 2, "--out", "empty")  # the real command; the others in this process
    one_line(shoal_here(capsys, *CLI, "--out", str(tmp_path / "file")), 2, "--out", "is a file")
    one_line(shoal_here(capsys, *CLI, "--out", str(tmp_path / "file" / "x")), 2, "--out", "which is a file")
    # Under torchrun every rank must name the same directory: no per-rank timestamped default.
    for name, value in {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29541"}.items():
        monkeypatch.setenv(name, value)
    one_line(shoal_here(capsys, *CLI), 2, "--out", "torchrun")


def test_read_only_out_is_refused(tmp_path):
    from shoal.errors import UserError
    from shoal.rundir.folder import check_out
    from shoal.rundir.lock import lock

    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (needs root)")  # root ignores permission bits
    try:
        with pytest.raises(UserError, match="cannot be created.*Read-only"):
            check_out(str(ro / "run"))
        with pytest.raises(UserError, match="not writable"):
            lock(ro)
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_default_out_is_a_new_directory_per_run(tmp_path, monkeypatch):
    from shoal.rundir.folder import default_out

    monkeypatch.chdir(tmp_path)
    first = default_out("recipes/debug.toml")
    assert first.parent.name == "runs" and first.name.startswith("debug-20") and not first.exists()
    first.mkdir(parents=True)
    again = default_out("recipes/debug.toml")  # the same second: a suffix, never the same directory
    assert again != first and not again.exists()
    assert default_out(None).name.startswith("train-")


HOLD = "import sys; from pathlib import Path; from shoal.rundir.lock import lock; lock(Path(sys.argv[1])); " \
       "print('locked', flush=True); sys.stdin.read()"


def test_a_live_run_holds_its_directory_and_a_dead_one_does_not(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        line = one_line(shoal_here(capsys, *CLI, "--out", str(out)), 2, "--out", "in use", f"pid {holder.pid}")
        assert "host" in line
    finally:
        holder.kill()  # SIGKILL: no clean-up ran, the lock file is still there, naming it
        holder.wait()
    assert (out / ".lock").read_text().split()[0] == str(holder.pid)
    taker = subprocess.run([sys.executable, "-c", HOLD, str(out)], input="", capture_output=True, text=True, env=env)
    assert taker.returncode == 0 and taker.stdout.strip() == "locked", taker.stderr  # the stale lock is taken over


@pytest.mark.timeout(240)
def test_plain_torchrun_prepares_on_every_rank_and_trains_like_one_process(done, tmp_path):
    """`torchrun -m shoal.train RECIPE --out DIR`, no shoal launcher: each rank prepares the job itself
    (shoal/launch/session.py), rank 0 alone holds the lock and writes job.json, and two ranks train
    what one process trained, checkpoints and model included."""
    from shoal.job import load_job
    from shoal.rundir.lock import lock, release

    out = tmp_path / "torchrun"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "shoal.train", *CLI[1:], "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                       timeout=220, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    losses = [row["loss"] for row in read_rows(out)]
    assert losses == pytest.approx([row["loss"] for row in read_rows(done)], abs=1e-4)
    job, how = load_job(out / "job.json")
    assert job.world == 2 and job.layout.dp_shard == 2 and how == {"out": str(out), "resume": "auto", "show": False}
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]
    assert (out / "model" / "model.safetensors").is_file()
    lock(out)  # rank 0 let go of it
    release(out)


def stopped_at_step_2(done, tmp_path):
    """A copy of the finished run as if it had stopped after its step-2 checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(done, out)
    shutil.rmtree(out / "checkpoints" / "step_00000004")
    shutil.rmtree(out / "model")
    return out


def test_resume_keeps_rows_up_to_the_checkpoint_once_each(done, tmp_path):
    out = stopped_at_step_2(done, tmp_path)
    rows = (out / "metrics.jsonl").read_text().splitlines()
    # What a killed run and an orphaned second writer left: a repeated row, a torn line, NUL bytes.
    with open(out / "metrics.jsonl", "a") as f:
        f.write(rows[0] + "\n" + rows[3][:40] + "\0\0\0\0")
    run(out)  # resumes from step 2: rows 3 and 4 are dropped and written again
    assert steps(out) == [1, 2, 3, 4]
    assert "\0" not in (out / "metrics.jsonl").read_text()


def test_resume_reads_past_metrics_rows_garbled_between_runs(done, tmp_path):
    """Bytes that are not UTF-8, JSON of another shape, a step too large for an int: skipped, not a traceback."""
    out = stopped_at_step_2(done, tmp_path)
    rows = (out / "metrics.jsonl").read_bytes().splitlines()
    garbled = [rows[0], b"\xff\xfe garbage {", b"[1, 2]", b'{"step": 1e999}', b'{"step": "x"}', rows[1], rows[2]]
    (out / "metrics.jsonl").write_bytes(b"\n".join(garbled) + b"\n")
    run(out)  # resumes from step 2
    assert steps(out) == [1, 2, 3, 4]


def test_a_run_stopped_during_its_final_export_writes_only_the_model_when_run_again(done, tmp_path, capsys):
    """Killed (or out of disk) while writing <out>/model: every step is checkpointed, and the same
    command, instead of refusing a finished run, writes the model from the last checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(done, out)
    shutil.rmtree(out / "model")
    (out / "model").mkdir()
    (out / "model" / "model.safetensors.partial").write_bytes(b"\0" * 1000)  # what the kill left
    before = (out / "metrics.jsonl").read_bytes()
    r = shoal_cli(*CLI, "--out", str(out))
    assert r.returncode == 0 and r.stderr.strip().splitlines() == [
        f"shoal: resuming from step 4 ({out / 'checkpoints' / 'step_00000004'}): every step is done, so this run "
        f"only writes the final model, {out / 'model'}"], r.stderr
    assert sorted(p.name for p in (out / "model").iterdir()) == ["model.safetensors", "shoal_model.json"]
    assert (out / "model" / "model.safetensors").read_bytes() == (done / "model" / "model.safetensors").read_bytes()
    assert (out / "metrics.jsonl").read_bytes() == before
    one_line(shoal_here(capsys, *CLI, "--out", str(out)), 2, "nothing left to train")  # now it is finished


@pytest.mark.parametrize("code, said, remedy", [
    (errno.ENOSPC, "no space left on device", "free some space"),
    (errno.EDQUOT, "disk quota exceeded", "raise the quota"),
    (errno.EROFS, "read-only file system", "remount it read-write"),
    (errno.EACCES, "permission denied", "make it writable")])
def test_each_refusal_of_the_disk_is_one_line_naming_it(tmp_path, code, said, remedy):
    """What a disk can refuse a write for mid-run (it filled, the quota ran out, it was remounted
    read-only, permissions changed), as Python, DCP (a BaseException carrying each rank's error) and
    safetensors (Rust's "(os error N)") report it."""
    from torch.distributed.checkpoint.api import CheckpointException

    from shoal.rundir.disk import DiskFull, no_space_left

    target = tmp_path / "ckpt"
    for error in (OSError(code, os.strerror(code), str(target)),
                  CheckpointException("save", {1: (OSError(code, os.strerror(code)), None)}),
                  RuntimeError(f"{os.strerror(code)} (os error {code})")):
        with pytest.raises(DiskFull) as e, no_space_left(target, kept="the ones before are intact; ", then=", or X"):
            raise error
        assert str(e.value).startswith(f"{said} while writing {target}; the ones before are intact; ")
        assert remedy in str(e.value) and str(e.value).endswith(", or X")
    with pytest.raises(KeyError), no_space_left(target):  # anything else is not the disk's doing
        raise KeyError("x")


def test_truncate_metrics_drops_later_torn_and_repeated_rows(tmp_path):
    from shoal.rundir.metrics import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"step": 1}\n{"step": 3}\n{"st\0\0\n{"step": 2, "x": 1}\n')
    truncate_metrics(tmp_path, 2)  # the run folder holding it
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_resuming_a_finished_run_is_refused_before_building(done, capsys):
    before = (done / "metrics.jsonl").read_bytes()
    one_line(shoal_here(capsys, *CLI, "--out", str(done)), 2, "train.steps=4", "step 4", "nothing left to train")
    one_line(shoal_here(capsys, *CLI, "--set", "train.steps=3", "--out", str(done)), 2, "train.steps=3", "step 4")
    assert (done / "metrics.jsonl").read_bytes() == before


def test_every_checkpoint_damaged_is_refused_not_started_over(done, tmp_path, capsys):
    from shoal.checkpoint.choose import choose_checkpoint
    from shoal.errors import UserError

    out = tmp_path / "run"
    shutil.copytree(done, out)
    for ckpt in (out / "checkpoints").iterdir():
        shard = ckpt / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
    before = (out / "metrics.jsonl").read_bytes()
    one_line(shoal_here(capsys, *CLI, "--set", "train.steps=6", "--out", str(out)), 2, "--resume", "none is intact")
    one_line(shoal_here(capsys, *CLI, "--set", "train.steps=6", "--out", str(tmp_path / "new"), "--resume",
                       str(out / "checkpoints" / "step_00000004")), 2, "--resume", "not an intact", "truncated")
    with pytest.raises(UserError, match="none is intact"):  # and the verified choice at start says the same
        choose_checkpoint("auto", out / "checkpoints")
    assert (out / "metrics.jsonl").read_bytes() == before


def test_a_fresh_run_does_not_overwrite_another_runs_metrics(done, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(done, out)
    shutil.rmtree(out / "checkpoints")
    before = (out / "metrics.jsonl").read_bytes()
    for resume in ("auto", "never"):
        one_line(shoal_here(capsys, *CLI, "--out", str(out), "--resume", resume), 2, "--out", "metrics.jsonl")
    assert (out / "metrics.jsonl").read_bytes() == before


def test_nonfinite_loss_stops_and_saves_nothing(done, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(done, out)
    manifest = (out / "checkpoints" / "step_00000004" / "manifest.json").read_bytes()
    model = (out / "model" / "model.safetensors").read_bytes()
    # Continue to step 8 with a learning rate that blows the weights up on the first update.
    r = shoal_cli(*CLI, "--set", "train.steps=8", "--set", "train.lr=1e30", "--out", str(out))
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]  # after "resuming from step 4"
    assert "stopping before it reaches a checkpoint" in line and "train.on_nonfinite=skip" in line
    assert line.startswith("shoal train: error: step ") and (" is nan" in line or " is inf" in line)
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == ["step_00000002", "step_00000004"]
    assert (out / "checkpoints" / "step_00000004" / "manifest.json").read_bytes() == manifest
    assert (out / "model" / "model.safetensors").read_bytes() == model


def test_nonfinite_guard_policies(capsys):
    from shoal.train.nonfinite import NonFiniteGuard, NonFiniteStep

    stopped = []
    guard = NonFiniteGuard("stop", before_stop=lambda: stopped.append(True))
    assert guard.allows_update(1, 2.5, 0.9)
    with pytest.raises(NonFiniteStep, match=r"^step 7: loss is nan and grad norm is inf;"):
        guard.allows_update(7, float("nan"), float("inf"))
    assert stopped == [True]  # the save in flight (an earlier, good step) is finished first
    skip = NonFiniteGuard("skip")
    assert not skip.allows_update(3, 1.0, float("nan")) and not skip.allows_update(4, float("inf"), 1.0)
    assert skip.allows_update(5, 1.0, 1.0) and skip.skipped == 2
    assert "step 4: loss is inf; update skipped (2 so far" in capsys.readouterr().err


@pytest.fixture
def small_disk(done, tmp_path):
    """A tmpfs with room for about one and a half checkpoints of the debug run."""
    size = sum(f.stat().st_size for f in (done / "checkpoints" / "step_00000002").iterdir())
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2 // 1024}k", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    yield disk
    # Lazy: the failed in-process run still holds its metrics.jsonl open (a real run exits and closes it).
    subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.mark.parametrize("async_save", ["false", "true"])
def test_disk_full_is_one_line_and_the_previous_checkpoint_survives(small_disk, async_save):
    from shoal.checkpoint import store
    from shoal.rundir.disk import DiskFull

    out = small_disk / "run"
    with pytest.raises(DiskFull) as e:
        run(out, f"checkpoint.async={async_save}")
    partial = out / "checkpoints" / ".partial-step_00000004"
    assert str(e.value).startswith(f"no space left on device while writing {partial};")
    assert [s for s, _ in store.list_checkpoints(out / "checkpoints")] == [2]
    assert store.problems(out / "checkpoints" / "step_00000002") == []
    assert not list((out / "checkpoints").glob(".partial-*")) and not (out / "model").exists()


def test_a_checkpoint_disk_turned_read_only_is_one_line(tmp_path):
    """The disk under checkpoint.dir remounted read-only (a failing disk, an admin): the first save
    is refused with one line, not DCP's traceback from every rank."""
    from shoal.rundir.disk import DiskFull

    disk = tmp_path / "ro"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(disk)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        with pytest.raises(DiskFull) as e:
            run(tmp_path / "run", f"checkpoint.dir={disk}")
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)
    assert str(e.value) == (f"read-only file system while writing {disk / '.partial-step_00000002'}; the checkpoints "
                            "before it are intact; remount it read-write, or set checkpoint.dir or --out on another disk")


def test_sigterm_during_the_last_step_or_the_export_is_a_finished_run(done, tmp_path):
    """The launcher's exit code after a SIGTERM that came at `since`: 0 when this launch (begun at
    `started`) wrote the final model anyway (a requeue on 75 would be refused: nothing left to
    train), 75 when a checkpoint was committed after the signal, 143 otherwise."""
    from shoal.checkpoint import store
    from shoal.train.preempt import exit_code_after
    from shoal.worker.exit_codes import PREEMPTED as EXIT_CODE

    out = tmp_path / "run"
    shutil.copytree(done, out)
    root, model = out / "checkpoints", out / "model" / "model.safetensors"
    saved = store.read_train_state(root / "step_00000004")["time"]
    written = model.stat().st_mtime
    assert exit_code_after(root, 2, out, written - 1, saved - 1) == 0  # this launch wrote the model
    assert exit_code_after(root, 2, out, written + 1, saved - 1) == EXIT_CODE  # an earlier launch's model
    assert exit_code_after(root, 2, out, written + 1, saved + 1) == 128 + 15


def test_a_checkpoint_folder_removed_while_a_save_writes_it_is_one_line(tmp_path, monkeypatch):
    """A clean-up script deleting the checkpoint folder mid-save: one line, not DCP's traceback per rank."""
    import shoal.checkpoint.checkpointer as checkpointer
    from shoal.errors import UserError

    save = checkpointer.dcp.save

    def save_then_removed(state, storage_writer, **kw):
        save(state, storage_writer=storage_writer, **kw)
        shutil.rmtree(storage_writer.path.parent)  # the whole checkpoint root, before the save is hashed

    monkeypatch.setattr(checkpointer.dcp, "save", save_then_removed)
    out = tmp_path / "run"
    with pytest.raises(UserError) as e:
        run(out)
    assert str(e.value) == (f"checkpoint.dir={str(out / 'checkpoints')!r}: {out / 'checkpoints' / '.partial-step_00000002'}"
                            " was removed while step 2 was being saved, by something other than this run; leave the "
                            "checkpoint folder alone while a run writes it (the same command resumes from the newest "
                            "checkpoint left, if any)")
