"""Output locations: every flag or config field naming one is checked before any work, and a refused
command (one line, exit 2) creates nothing: no folder, no lock file, no probe left behind.

In-process through `shoal.cli.main.main`, as tests/unit/test_bad_inputs.py does.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from shoal.cli.main import main

pytestmark = pytest.mark.timeout(60)
PLAN = ["plan", "--model", "debug", "--seq-len", "64", "--global-batch", "8", "--gpus", "8", "--gpu", "h100"]
K8S = ["k8s", "recipes/debug.toml", "--nodes", "2", "--gpus-per-node", "1", "--image", "x"]
SLURM = ["slurm", "recipes/debug.toml", "--nodes", "2", "--gpus-per-node", "1", "--run-out", "{tmp}/made"]
TRAIN = ["train", "--quiet", "--set", "model.preset=debug", "--set", "train.steps=2", "--set",
         "data.path={tmp}/corpus.txt", "--set", "train.seq_len=32", "--set", "train.global_batch=4",
         "--set", "train.micro_batch=2", "--set", "train.eval_batches=1", "--set", "train.sample_tokens=0"]
CORPUS = "".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(2000))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished run with checkpoints, whose default report folder is taken by a file."""
    work = tmp_path_factory.mktemp("output-paths")
    (work / "corpus.txt").write_text(CORPUS)
    assert main([a.format(tmp=work) for a in TRAIN] + ["--out", str(work / "run"), "--set", "checkpoint.every=1"]) == 0
    (work / "run" / "report").write_text("x\n")
    return work / "run"


@pytest.fixture
def where(tmp_path, run, monkeypatch) -> dict[str, Path]:
    """{tmp}: a folder holding `afile` (a plain file), `adir` (a folder that is no run or checkpoint)
    and a corpus; {run}: the finished run. Commands run from the repository root."""
    (tmp_path / "afile").write_text("x\n")
    (tmp_path / "adir").mkdir()
    (tmp_path / "corpus.txt").write_text(CORPUS)
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    return {"tmp": tmp_path, "run": run}


def snapshot(where: dict[str, Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for root in where.values() for p in sorted(root.rglob("*"))}


def refused(capsys, argv: list[str], where: dict[str, Path], hint: str) -> str:
    """Run argv ({tmp} and {run} filled in): exit 2, one line naming hint, nothing created or changed."""
    before = snapshot(where)
    try:
        code = main([a.format(**where) for a in argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, f"exit {code}\n{out[-1500:]}\n{err[-1500:]}"
    assert hint in lines[0], lines[0]
    assert snapshot(where) == before, "a refused command created or changed files"
    return lines[0]


CASES = [  # (argv, what the one line must name)
    [[*PLAN, "--report", "{tmp}/afile"], "--report"], [[*PLAN, "--report", "{tmp}/afile/sub"], "which is a file"],
    [[*PLAN, "--figures", "{tmp}/afile/sub"], "--figures"], [[*PLAN, "--emit", "{tmp}/afile/x.toml"], "--emit"],
    [["report", "{run}", "--out", "{tmp}/afile"], "--out"], [["report", "{run}", "--out", "{tmp}/afile/x"], "--out"],
    [["report", "{run}"], "report"],  # the default RUN_DIR/report is a file
    [["mesh", "--nproc", "4", "--svg", "{tmp}/afile/x.svg"], "--svg"],
    [[*SLURM, "--out", "{tmp}/afile/x"], "--out"], [[*SLURM[:-1], "{tmp}/afile/r"], "--run-out"],
    [[*K8S, "--out", "{tmp}/afile/x"], "--out"],
    [["ckpt", "export", "{run}", "--hf", "{tmp}/afile/hf"], "--hf"], [["ckpt", "export", "{run}", "--hf", ""], "--hf"],
    [["ckpt", "export", "{run}", "--hf", "{run}/model"], "a saved model"],  # it would replace the run's own weights
    [["verify", "--out", "{tmp}/afile/v"], "--out"], [["doctor", "--out", "{tmp}/afile/d"], "--out"],
    [[*PLAN, "--emit", "{tmp}/" + "x" * 300 + ".toml"], "more than the"],  # a name past NAME_MAX reads as missing
    # A folder of other files: the command wrote its own files among them, replacing any of the same name.
    [["report", "{run}", "--out", "{tmp}"], "other files in it"], [["report", "{run}", "--out", "{run}/model"], "other files"],
    [[*PLAN, "--report", "{tmp}"], "other files in it"], [[*PLAN, "--figures", "{tmp}"], "other files in it"],
    [["verify", "--out", "{tmp}"], "other files in it"], [["doctor", "--out", "{tmp}"], "other files in it"],
    [[*PLAN, "--emit", "{tmp}/afile"], "shoal did not write"],  # replaced a file a person wrote
    [[*K8S, "--out", "{tmp}"], "other files in it"],
    [[*SLURM, "--name", "x" * 300, "--out", "{tmp}/s"], "more than the"],  # a traceback, after making --run-out
]
EMPTY = [  # flags whose empty value used to read as "not given" (or as the current folder)
    [*PLAN, "--report"], [*PLAN, "--figures"], [*PLAN, "--emit"], [*PLAN, "--region"], [*PLAN, "--carbon-trace"],
    ["mesh", "--nproc", "4", "--svg"], [*SLURM, "--name"], [*SLURM, "--out"], [*K8S, "--queue"], [*K8S, "--out"],
    ["report", "{run}", "--out"], ["verify", "--layouts"], ["doctor", "--ops"], ["train", "--resume"],
    [*SLURM, "--python"], [*SLURM, "--partition"], [*SLURM, "--time"],
]
EMPTY_POSITIONAL = [  # an empty path read as the current folder, and the error named '.'
    (["report", ""], "run_dir"), (["generate", ""], "model_dir"), (["ckpt", "inspect", ""], "path"),
    (["ckpt", "export", "", "--hf", "{tmp}/hf"], "path"),
]


@pytest.mark.parametrize("argv,hint", CASES, ids=[" ".join(a[0][:1] + a[0][-2:]) for a in CASES])
def test_bad_output_location_is_refused_before_any_work(argv, hint, where, capsys):
    refused(capsys, argv, where, hint)


def test_a_page_that_is_not_shoals_is_not_replaced(where, capsys):
    (where["tmp"] / "site").mkdir()
    (where["tmp"] / "site" / "index.html").write_text("<html><title>my page</title></html>\n")
    refused(capsys, [*PLAN, "--report", "{tmp}/site"], where, "other files in it (index.html)")


def test_a_drawing_that_is_not_shoals_is_not_replaced(where, capsys):
    (where["tmp"] / "logo.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"><circle r="4"/></svg>\n')
    refused(capsys, ["mesh", "--nproc", "4", "--svg", "{tmp}/logo.svg"], where, "shoal did not write")


def test_a_script_or_an_object_that_is_not_shoals_is_not_replaced(where, capsys):
    (where["tmp"] / "job.sbatch").write_text("#!/bin/bash\nsrun ./my_own_job\n")
    refused(capsys, [*SLURM, "--out", "{tmp}", "--name", "job"], where, "shoal did not write")
    (where["tmp"] / "k8s").mkdir()
    (where["tmp"] / "k8s" / "jobset.yaml").write_text("apiVersion: v1\nkind: ConfigMap\n")
    refused(capsys, [*K8S, "--out", "{tmp}/k8s"], where, "other files in it (jobset.yaml)")


def test_one_file_is_written_beside_a_link_but_not_through_one(where, capsys):
    """--emit, --svg and slurm's script write one file: a link elsewhere in its folder (a project's .venv)
    refused them all, since the folder's whole-tree link check ran; the file itself is still not a link."""
    (where["tmp"] / "proj").mkdir()
    (where["tmp"] / "proj" / ".venv").symlink_to(where["tmp"])  # leads out of proj
    grid = ["mesh", "--nproc", "4", "--svg", str(where["tmp"] / "proj" / "grid.svg")]
    assert main(grid) == 0, capsys.readouterr().err
    (where["tmp"] / "proj" / "linked.svg").symlink_to(where["tmp"] / "proj" / "grid.svg")
    refused(capsys, ["mesh", "--nproc", "4", "--svg", "{tmp}/proj/linked.svg"], where, "is a symbolic link")


def test_an_earlier_output_is_replaced(where, capsys):
    """A plan's page, figures and recipe written twice into the same places: the second replaces the first."""
    argv = [a.format(**where) for a in [*PLAN, "--report", "{tmp}/plan", "--figures", "{tmp}/plan", "--emit",
                                        "{tmp}/plan.toml"]]
    assert main(argv) == 0 and main(argv) == 0, capsys.readouterr().err
    grid = ["mesh", "--nproc", "4", "--svg", str(where["tmp"] / "grid.svg")]
    assert main(grid) == 0 and main(grid) == 0, capsys.readouterr().err
    for argv in ([*SLURM, "--out", "{tmp}/slurm"], [*K8S, "--out", "{tmp}/k8s"]):  # their marks are known
        argv = [a.format(**where) for a in argv]
        assert main(argv) == 0 and main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("argv", EMPTY, ids=[" ".join(a[:1] + a[-1:]) for a in EMPTY])
def test_empty_value_is_refused(argv, where, capsys):
    refused(capsys, argv + [""], where, f"argument {argv[-1]}: must not be empty")


@pytest.mark.parametrize("argv,name", EMPTY_POSITIONAL, ids=[" ".join(a[0][:2]) for a in EMPTY_POSITIONAL])
def test_empty_positional_path_is_refused(argv, name, where, capsys):
    refused(capsys, argv, where, f"argument {name}: must not be empty")


@pytest.mark.parametrize("argv", [["verify", "--layouts", ";;"], ["doctor", "--ops", " , "]])
def test_list_of_only_separators_is_refused(argv, where, capsys):
    refused(capsys, argv, where, f"argument {argv[-2]}: must not be empty")


TRAIN_CASES = [  # (extra argv, what the line must name); --out is a fresh {tmp}/o/deep, which is never made
    [["--set", "checkpoint.every=1", "--set", "checkpoint.dir={tmp}/afile/x"], "checkpoint.dir"],
    [["--set", "checkpoint.dir={tmp}/afile"], "checkpoint.dir"],
    [["--resume", "/nonexistent"], "--resume"], [["--resume", "{tmp}/afile"], "--resume"],
    [["--resume", "{tmp}/adir"], "--resume"],
    [["--out", "{run}/model"], "a saved model"], [["--out", "{run}/checkpoints"], "a checkpoint root"],
    [["--set", "data.path={tmp}"], "lies inside the corpus"],  # its metrics.jsonl would be the next run's text
    [["--out", "{tmp}/" + "x" * 300], "more than the"], [["--set", "checkpoint.dir={tmp}/" + "x" * 300], "more than the"],
    *([[["--set", "checkpoint.dir=/proc/shoal-ckpt"], "cannot be created"]] if os.path.isdir("/proc/self") else []),
    # checkpoints among the run's own outputs, or in a folder of something else shoal wrote: they were saved there
    [["--set", "checkpoint.dir=model"], "lies in model"], [["--set", "checkpoint.dir=report/ck"], "lies in report"],
    [["--set", "checkpoint.dir=."], "output directory itself"],
    [["--set", "checkpoint.dir={tmp}/o/deep/model"], "lies in model"],
    [["--set", "checkpoint.dir={tmp}/o/deep"], "output directory itself"],
    [["--set", "checkpoint.dir={run}"], "holds a run directory"], [["--set", "checkpoint.dir={run}/model"], "a saved model"],
    [["--set", "checkpoint.dir={run}/checkpoints/step_00000001"], "holds a checkpoint"],
    [["--out", "{tmp}"], "other files in it"],  # a fresh run's model/ and checkpoints/ went among them
]


@pytest.mark.parametrize("extra,hint", TRAIN_CASES, ids=[c[0][-1] for c in TRAIN_CASES])
def test_train_refusal_leaves_no_out_directory(extra, hint, where, capsys):
    refused(capsys, TRAIN + ["--out", "{tmp}/o/deep", *extra], where, hint)


def test_a_start_that_died_before_run_json_can_be_run_again(where, capsys):
    """What such a start leaves (its lock, an empty checkpoint root) and shoal slurm's log are no other files."""
    early = where["tmp"] / "early"
    (early / "checkpoints").mkdir(parents=True)
    (early / ".lock").write_text("")
    (early / "slurm-7.out").write_text("")
    assert main([a.format(**where) for a in TRAIN] + ["--out", str(early)]) == 0, capsys.readouterr().err


def test_train_refusal_leaves_nothing_in_the_default_or_an_existing_out(where, capsys, monkeypatch):
    """No runs/<recipe>-<time> in the working folder, and no lone .lock in an existing --out."""
    monkeypatch.chdir(where["tmp"])
    refused(capsys, TRAIN + ["--resume", "/nonexistent"], where, "--resume")
    refused(capsys, TRAIN + ["--set", "train.nonsense=1"], where, "train.nonsense")
    refused(capsys, TRAIN + ["--out", "{tmp}/adir", "--resume", "/nonexistent"], where, "--resume")


def test_the_check_creates_nothing(where):
    from shoal.files import check_output_dir, check_output_file

    check_output_dir("--out", str(where["tmp"] / "a" / "b"))
    check_output_file("--emit", str(where["tmp"] / "c" / "plan.toml"))
    assert sorted(p.name for p in where["tmp"].iterdir()) == ["adir", "afile", "corpus.txt"]


def test_a_tilde_is_the_home_folder(where, monkeypatch):
    """checkpoint.dir and data.cache_dir as in a recipe (no shell to expand ~): not a folder named ~."""
    from shoal.checkpoint.choose import checkpoint_root
    from shoal.config import load_config
    from shoal.config import DataConfig
    from shoal.data.corpus import load_data

    monkeypatch.setenv("HOME", str(where["tmp"]))
    assert checkpoint_root(load_config(None, ["checkpoint.dir=~/ckpts"]), Path("out")) == where["tmp"] / "ckpts"
    load_data(DataConfig(path=str(where["tmp"] / "corpus.txt"), cache_dir="~/cache"), 256)
    assert (where["tmp"] / "cache").is_dir() and not Path("~").exists()


def test_a_checkpoint_folder_belongs_to_one_run(where, capsys):
    """A second run whose checkpoint.dir was the first run's resumed from its checkpoints and let its
    checkpoint.keep delete them; it is refused, naming the first run (which, moved, keeps them)."""
    import shutil

    from shoal.checkpoint.choose import check_resume, owner_of
    from shoal.config import load_config

    line = refused(capsys, TRAIN + ["--out", "{tmp}/second", "--set", "checkpoint.dir={run}/checkpoints"], where,
                   "holds the checkpoints of the run in")
    assert str(where["run"]) in line
    moved = shutil.copytree(where["run"], where["tmp"] / "moved", symlinks=True)
    assert owner_of(moved / "checkpoints") == moved
    check_resume(load_config(None, ["model.preset=debug", "train.steps=3"]), moved, "auto")


@pytest.mark.parametrize("name", [".lock", "model/shoal_model.json", "checkpoints"])
def test_a_link_out_of_the_run_folder_is_never_written_through(name, where, capsys):
    """Resuming a run whose .lock or model/shoal_model.json was a link overwrote the link's target."""
    import shutil

    copy = shutil.copytree(where["run"], where["tmp"] / "copy", symlinks=True)
    target = where["tmp"] / ("adir" if name == "checkpoints" else "afile")
    shutil.rmtree(copy / name) if (copy / name).is_dir() else (copy / name).unlink()
    (copy / name).symlink_to(target)
    refused(capsys, TRAIN + ["--out", str(copy), "--set", "train.steps=3"], where, f"holds {name}, a symbolic link")


def test_a_run_folder_deleted_mid_run_stops_the_run(tmp_path):
    """Deleted under a running run, the folder was recreated (checkpoints/, model/) and the run exited
    0 with no metrics, run.json or lock: the next row's write notices, and the run stops."""
    import shutil

    from shoal.errors import UserError
    from shoal.rundir.metrics import MetricsLog

    (tmp_path / "run").mkdir()
    log = MetricsLog(tmp_path / "run")
    log.write({"step": 1, "loss": 5.0})
    shutil.rmtree(tmp_path / "run")
    with pytest.raises(UserError, match="was deleted, moved or replaced .* stopped after step 2"):
        log.write({"step": 2, "loss": 4.0})
    assert not (tmp_path / "run").exists()
    (tmp_path / "run").mkdir()  # moved: the metrics go on in the new place, checkpoints would go to the old
    log = MetricsLog(tmp_path / "run")
    (tmp_path / "run").rename(tmp_path / "moved")
    with pytest.raises(UserError, match="was deleted, moved or replaced"):
        log.write({"step": 1, "loss": 5.0})


def test_resuming_onto_another_corpus_of_the_same_size_is_warned(where, capsys):
    """The loader compares only the sequence count, so another corpus (or tokenizer) of the same size
    resumed in silence, although docs/checkpointing.md says it is warned about."""
    import shutil

    copy = shutil.copytree(where["run"], where["tmp"] / "copy", symlinks=True)
    text = (where["tmp"] / "corpus.txt").read_text()
    (where["tmp"] / "other.txt").write_text(text[::-1])  # as many tokens, other ones
    argv = [a.format(**where) for a in TRAIN] + ["--out", str(copy), "--set", "train.steps=3",
                                                 "--set", f"data.path={where['tmp'] / 'other.txt'}"]
    assert main(argv) == 0
    assert "warning: the checkpoint was trained on other tokens" in capsys.readouterr().err


@pytest.mark.parametrize("argv,line,n", [
    [["train", "--print-mesh", "--set", "parallel.topk_density=0.3"],
     "parallel.topk_density=0.3 has no effect: it acts only with parallel.grad_compression=topk (here none)", 1],
    [["train", "--print-mesh", "--set", "parallel.diloco_outer_lr=0.5", "--set", "parallel.pp_lighter_edges=1"],
     "parallel.diloco_outer_lr=0.5 has no effect: it acts only with parallel.diloco_inner_steps > 0", 2],
    [["train", "--print-mesh", "--set", "parallel.pp_schedule=1f1b"], None, 0],  # the default: nothing to say
    [["train", "--print-mesh", "--set", "checkpoint.async=true"], "it acts only with checkpoint.every > 0", 1],
    [[*PLAN, "--powersgd-rank", "8", "--top", "1"],
     "--powersgd-rank=8 has no effect: it acts only with --grad-compression=powersgd", 1],
    [[*PLAN, "--pp", "1", "--pp-schedule", "gpipe", "--top", "1"], "--pp-schedule=gpipe has no effect", 1],
    [[*PLAN, "--pp-schedule", "gpipe", "--top", "1"], None, 0],  # pp searched: the schedule may act
])
def test_a_setting_that_its_layout_ignores_is_warned_about(argv, line, n, where, capsys):
    """A setting with no effect in the layout given (DiLoCo's without DiLoCo, a compression method's
    without it, a pipeline's without pp) was accepted in silence: one warning line each."""
    assert main(argv) == 0
    warnings = [w for w in capsys.readouterr().err.splitlines() if "warning:" in w]
    assert len(warnings) == n and (line is None or line in warnings[0]), warnings


def test_a_one_rank_checkpoint_layout_is_said_in_words(where, capsys):
    """`shoal ckpt inspect` printed a 1-rank checkpoint's layout as `1:`."""
    assert main(["ckpt", "inspect", str(where["run"]), "--no-checksums"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "MB" in line]
    assert rows and all(" 1 rank " in row and " 1: " not in row for row in rows), rows


def test_a_run_that_kept_no_checkpoints_says_where_its_weights_are(where, capsys):
    """`shoal ckpt inspect` of such a run said it was no `shoal train --out` directory."""
    import shutil

    copy = shutil.copytree(where["run"], where["tmp"] / "copy", symlinks=True, ignore=shutil.ignore_patterns("checkpoints"))
    code = main(["ckpt", "inspect", str(copy)])
    assert code == 2 and f"its final weights are in {copy / 'model'}" in capsys.readouterr().err
