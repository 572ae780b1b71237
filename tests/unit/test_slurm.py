"""`shoal slurm`: the sbatch script (golden file, bash syntax), bad input, and the srun-copies guard.

No Slurm runs in these tests: the script is checked as text and by `bash -n` (the real one-node
Slurm runs it in tests/cluster/test_real_slurm.py).
"""

import os
import subprocess
from pathlib import Path

import pytest

from conftest import shoal_cli
from shoal.cli.main import main

GOLDEN = Path(__file__).parent / "golden" / "slurm" / "tiny.sbatch"
REPO = Path(__file__).resolve().parents[2]


def write(tmp_path, *extra):
    return main(["slurm", "recipes/tiny.toml", "--nodes", "2", "--gpus-per-node", "4", "--partition", "gpu",
                 "--time", "01:00:00", "--run-out", "/shared/runs/tiny", "--out", str(tmp_path), *extra])


def test_script_matches_golden_and_parses(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", lambda *a, **k: None)  # /shared/runs is this test's made-up shared disk
        assert write(tmp_path, "--set", "train.steps=5") == 0
    got = (tmp_path / "tiny.sbatch").read_text()
    if os.environ.get("SHOAL_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text(), "regenerate with SHOAL_UPDATE_GOLDEN=1 if intended"
    assert subprocess.run(["bash", "-n", str(tmp_path / "tiny.sbatch")]).returncode == 0
    # node order is the allocation's: static rendezvous with the node's index in the job
    assert '--nproc 4 --nnodes "$SLURM_JOB_NUM_NODES" --node-rank "$SLURM_NODEID"' in got and "--rdzv static" in got
    # saved on SIGTERM (exit 75): requeued, to resume from that checkpoint
    assert "#SBATCH --requeue" in got and 'if [ "$code" -eq 75 ]' in got and 'scontrol requeue "$SLURM_JOB_ID"' in got


@pytest.mark.parametrize("flag,value,field", [
    ("--nodes", "0", "--nodes"), ("--time", "an hour", "--time"), ("--partition", "gpu;rm", "--partition"),
    ("--time", "99999999:00:00", "--time"), ("--time", "1000-00:00:00", "--time"),  # past a year: a unit slip
    ("--time", "2", "--time"), ("--time", "1:30", "--time"),  # SIGTERM at once: save, requeue, SIGTERM, forever
    ("--nodes", "3", "train.global_batch"),  # the recipe's batch does not split over 12 ranks
])
def test_bad_input_is_one_line(flag, value, field, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    args = ["slurm", "recipes/tiny.toml", "--nodes", "2", "--gpus-per-node", "4", "--out", str(tmp_path / "o")]
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shoal slurm: error: {field}=") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("leaf", ["my runs", "a#b", "it's", 'say "hi"', "ü x"])
def test_run_out_with_spaces_is_one_value_for_sbatch(leaf, tmp_path, monkeypatch):
    """sbatch splits an #SBATCH line at whitespace and ends it at '#' outside quotes (shlex with comments
    reads it the same way): `--run-out '/x/my runs'` wrote a script sbatch refused, 'Invalid directive
    found in batch script: runs/slurm-%j.out'."""
    import shlex

    monkeypatch.chdir(REPO)
    run_out = str(tmp_path / leaf)
    assert main(["slurm", "recipes/tiny.toml", "--nodes", "2", "--gpus-per-node", "4", "--run-out", run_out,
                 "--out", str(tmp_path / "o")]) == 0
    got = (tmp_path / "o" / "tiny.sbatch").read_text()
    (line,) = [x for x in got.splitlines() if x.startswith("#SBATCH --output=")]
    assert shlex.split(line.removeprefix("#SBATCH"), comments=True) == [f"--output={run_out}/slurm-%j.out"]
    assert subprocess.run(["bash", "-n", str(tmp_path / "o" / "tiny.sbatch")]).returncode == 0


def test_run_out_no_sbatch_line_can_carry_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert main(["slurm", "recipes/tiny.toml", "--nodes", "2", "--gpus-per-node", "4", "--run-out",
                 str(tmp_path / "a\nb"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shoal slurm: error: --run-out=") and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "a\nb").exists()


def test_srun_copies_are_refused(tmp_path):
    """What `srun -n2 python -m shoal.train` looks like to each copy: SLURM_NTASKS=2, no WORLD_SIZE."""
    r = shoal_cli("train", "--set", "model.preset=debug", "--set", "train.steps=1", "--out", str(tmp_path / "run"),
                  env={"SLURM_NTASKS": "2", "SLURM_PROCID": "1"})
    assert r.returncode == 2 and r.stderr.startswith("shoal train: error: SLURM_NTASKS=2: srun started 2 copies"), \
        r.stderr
    assert not (tmp_path / "run").exists()
