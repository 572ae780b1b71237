"""The end-of-run export on 2 ranks when the disk refuses it: every rank stops together with one line
(rank 1 no longer waits in the next tensor's collective for a rank 0 that has left, and then prints the
store client's C++ stack), and no partial file is left. That the same command then writes only the
model is tests/integration/test_rundir.py's (one process: the same code path, a third of the time)."""

import subprocess

import pytest

from conftest import shoal_cli

pytestmark = pytest.mark.timeout(180)

RUN = ["--set", "model.preset=debug", "--set", "train.steps=2", "--set", "train.micro_batch=4",
       "--set", "train.global_batch=8", "--set", "train.seq_len=64", "--set", "train.eval_every=0",
       "--set", "train.eval_batches=1", "--set", "train.sample_tokens=0", "--set", "checkpoint.every=2",
       "--nproc", "2", "--quiet"]


C10D_CHATTER = ("[rank1]:[E", "Exception raised from", "frame #", "<omitting python frames>")


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs with room for the run's metrics but not its 0.8 MB model."""
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], check=True)


def test_a_full_disk_during_the_final_export_is_one_line(small_disk, tmp_path):
    out, ckpts = small_disk / "run", tmp_path / "ckpts"  # the checkpoints on a disk with room
    cmd = ["train", *RUN, "--set", f"checkpoint.dir={ckpts}", "--out", str(out)]
    r = shoal_cli(*cmd, timeout=150)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and lines[0] == (
        f"shoal train: error: no space left on device while writing {out / 'model'}; every step is done and "
        f"{ckpts / 'step_00000002'} is committed; free some space, then run the same command again: it only "
        "writes the model"), r.stderr[-3000:]
    # Rank 1 could catch rank 0 (the store's host) leaving between its check that the store is there
    # and its goodbye, and torch's store client then logged the failed connect with a C++ stack: 1 run
    # in 10 under load. Rank 0 now waits (at most 2 s) for the others' goodbyes: 0 in 22 since. Still
    # tolerated, for a rank slower than that; nothing else may be said.
    assert all(not line or line.startswith(C10D_CHATTER) for line in lines[1:]), r.stderr[-3000:]
    assert list((out / "model").iterdir()) == []  # the partial file is gone, and its space with it
