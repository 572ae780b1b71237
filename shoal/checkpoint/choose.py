"""Where checkpoints live and which one a run starts from (`--resume auto|never|PATH`). No torch here."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from shoal.checkpoint import store
from shoal.checkpoint.store import TRAIN_STATE
from shoal.errors import UserError
from shoal.files import check_output_dir
from shoal.rundir.folder import checkpoint_dir_problem
from shoal.rundir.metrics import has_rows
from shoal.rundir.names import (CHECKPOINTS, HF_EXPORT, MANIFEST, METRICS, MODEL, MODEL_WEIGHTS, list_checkpoints,
                                what_shoal_wrote)


def checkpoint_root(cfg, out: Path) -> Path:
    """checkpoint.dir (~ is the home folder, as in every path field; a relative one lies inside the
    output directory), or <out>/checkpoints."""
    configured = Path(cfg.checkpoint.dir).expanduser() if cfg.checkpoint.dir else Path(CHECKPOINTS)
    return configured if configured.is_absolute() else Path(out) / configured


def restart_count() -> int:
    """How many times the elastic agent has restarted this job's workers (0 outside an agent)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def choose_checkpoint(resume: str, root: Path, data_checksums: bool = True) -> Path | None:
    """`auto`: the newest intact checkpoint under root (None if there is none); `never`: None;
    anything else: that checkpoint directory, or the newest intact one in that checkpoint root.

    After an elastic restart the run always continues from its own newest checkpoint, if it has one.
    data_checksums=False: the tensor shards' checksums are left to the loader (store.problems).
    """
    def newest_valid(where: Path) -> Path | None:
        return store.newest_valid(where, data_checksums=data_checksums)

    if resume == "never" and not restart_count():
        _refuse_existing(root)
        return None
    if resume in ("auto", "never"):
        newest = newest_valid(root)
        if newest is None and (existing := list_checkpoints(root)):
            _refuse_all_damaged(resume, root, len(existing))
        return newest
    if restart_count() and (newest := newest_valid(root)) is not None:
        return newest
    path = Path(resume)
    if path.is_dir() and not (path / MANIFEST).exists() and list_checkpoints(path):
        chosen = newest_valid(path)
        if chosen is None:
            _refuse_all_damaged(resume, path, len(list_checkpoints(path)))
        return chosen
    _refuse_what_is_no_checkpoint(path, resume, data_checksums=data_checksums)
    step = store.read_train_state(path)["step"]
    newer = [s for s, p in list_checkpoints(root) if s > step and p.resolve() != path.resolve()]
    if newer:  # this run's saves would interleave with another timeline's, and `auto` would pick theirs
        raise UserError("--resume", resume, f"is step {step}, but {root} already holds later checkpoints "
                        f"(steps {', '.join(map(str, newer))}); resume into another --out or checkpoint.dir")
    return path


def _refuse_what_is_no_checkpoint(path: Path, resume: str, checksums: bool = True, data_checksums: bool = True) -> None:
    """--resume PATH names one checkpoint: not another folder shoal wrote, not a damaged or unfinished save."""
    kind = what_shoal_wrote(path) if path.is_dir() else None
    if kind in ("a run directory", "a saved model", HF_EXPORT):  # not a checkpoint that failed to save
        where = f"{path / 'checkpoints'} (or one step_* in it)" if kind == "a run directory" else "a step_* checkpoint"
        raise UserError("--resume", resume, f"is {kind}, not a checkpoint; pass {where}, or --resume auto with "
                                            "--out set to the run")
    found = store.problems(path, checksums, data_checksums) if path.is_dir() else [f"{path} is not a directory"]
    if found:
        raise UserError("--resume", resume, f"is not an intact shoal checkpoint: {found[0]}")


def check_resume(cfg, out: Path, resume: str) -> None:
    """--resume mistakes, found before any worker starts (restarted workers skip this).

    Cheap checks only (sizes, not checksums): the authoritative choice is made again, verified,
    when the run starts (choose_checkpoint and check_not_finished).
    """
    if restart_count() or int(os.environ.get("RANK", "0")) != 0:
        return
    root = checkpoint_root(cfg, out)
    check_output_dir("checkpoint.dir", str(root))  # found here, not by the first save minutes into the run
    _check_own_folder(cfg.checkpoint.dir, root, out)
    _check_owner(cfg.checkpoint.dir, root, out)
    if resume == "never":
        _refuse_existing(root)
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        raise UserError("--resume", resume, "no such directory; pass auto, never, or a checkpoint directory "
                        f"(e.g. {root}/step_00000100)")
    start = _likely_start(root, resume)
    if start is not None:
        train_state = store.read_train_state(start)
        check_same_model(train_state.get("model", {}), cfg, start)  # here, not in a worker after it started
        check_not_finished(train_state["step"], cfg.train.steps, start, root, out)
    elif has_rows(Path(out)):
        raise UserError("--out", str(out), f"holds {METRICS} of an earlier run but no checkpoint to continue "
                        "from, and a fresh run would overwrite it; pick another --out, or delete "
                        f"{Path(out) / METRICS} to start over here")


def _check_own_folder(configured: str, root: Path, out: Path) -> None:
    """A checkpoint root is a folder of its own: not among this run's outputs (an absolute path can
    name one; a relative one config.validate checked), nor a folder of something else shoal wrote."""
    here, run = os.path.realpath(root), os.path.realpath(out)
    if os.path.commonpath([here, run]) == run and (problem := checkpoint_dir_problem(Path(os.path.relpath(here, run)))):
        raise UserError("checkpoint.dir", configured, problem)
    if (kind := what_shoal_wrote(root)) not in (None, "a checkpoint root"):
        raise UserError("checkpoint.dir", configured, f"holds {kind}, and checkpoints saved there would mix with it; "
                                                      "give a folder of its own")


def _check_owner(configured: str, root: Path, out: Path) -> None:
    """A checkpoint root belongs to one run: another run resuming from it would continue the first
    run's training, and its checkpoint.keep would delete the first run's checkpoints."""
    owner = owner_of(root)
    if owner is not None and owner.is_dir() and not _same_folder(owner, out):
        raise UserError("checkpoint.dir", configured or str(root), f"holds the checkpoints of the run in {owner}, "
                        "which this run would resume and then delete (checkpoint.keep); give this run a checkpoint.dir "
                        f"of its own, or continue that run with --out {owner}")


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def owner_of(root: Path) -> Path | None:
    """The run folder whose checkpoints a root holds: the one its newest checkpoint records
    (run_mark), or None (an empty root, checkpoints from before they recorded it)."""
    found = list_checkpoints(Path(root))
    try:
        mark = json.loads((found[-1][1] / TRAIN_STATE).read_text()).get("run") if found else None
    except (OSError, ValueError, AttributeError):
        return None
    return Path(os.path.normpath(Path(root) / mark)) if isinstance(mark, str) and mark else None


def run_mark(root: Path, out: Path) -> str:
    """What a checkpoint records of its run (train_state.json's "run"), relative to the checkpoint
    root: the way up where the root lies in the run folder (so the folder can move), else its path."""
    here, run = os.path.abspath(root), os.path.abspath(out)
    return os.path.relpath(run, here) if Path(here).is_relative_to(run) else run


def model_fields(cfg) -> dict:
    """The model a checkpoint is saved for (train_state.json's "model"): the job config's ModelConfig."""
    fields = dataclasses.asdict(cfg.model_config())
    fields.pop("note", None)
    return fields


def check_same_model(saved: dict, cfg, path: Path) -> None:
    """A checkpoint resumes only into the model it was saved for (the fields both know)."""
    now = model_fields(cfg)
    diff = [f"{k}={v}" for k, v in saved.items() if k in now and now[k] != v]
    if diff:
        raise UserError("--resume", str(path), f"was saved for another model ({', '.join(diff[:4])}"
                                               f"{' ...' if len(diff) > 4 else ''}); pass --resume never and another "
                                               "--out, or the model settings it was saved with")


def check_not_finished(step: int, steps: int, path: Path, root: Path, out: Path) -> None:
    """Resuming at or past train.steps would train nothing. Resuming at train.steps is allowed after an
    elastic restart, and when the checkpoint is the run's own (under its root) and <out>/model was
    never written (the run was stopped during its final export, or the disk was full): the run then
    only writes the model."""
    if step == steps and (restart_count() or (not final_model_written(out) and Path(path).parent.resolve()
                                              == Path(root).resolve())):
        return
    if step >= steps:
        raise UserError("train.steps", steps, f"the checkpoint to resume, {path}, is at step {step}: nothing left "
                        f"to train; raise train.steps (e.g. --set train.steps={2 * step}) to go on, or start over "
                        "with --resume never and another --out")


def final_model_written(out: Path, since: float = 0.0) -> bool:
    """<out>/model/model.safetensors, written at or after `since`: the export's last write renames it
    into place whole."""
    weights = Path(out) / MODEL / MODEL_WEIGHTS
    try:
        return weights.is_file() and weights.stat().st_mtime >= since
    except OSError:
        return False


def _likely_start(root: Path, resume: str) -> Path | None:
    """The checkpoint the run will start from, judged by sizes (no hashing); refuses when all are damaged."""
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume)
        if (path / MANIFEST).exists() or not list_checkpoints(path):  # one checkpoint, or what claims to be
            _refuse_what_is_no_checkpoint(path, resume, checksums=False)  # sizes only: cheap
            return path
        root = path
    existing = list_checkpoints(root)
    for _, path in reversed(existing):
        if not store.problems(path, checksums=False):
            return path
    if existing:
        _refuse_all_damaged(resume, root, len(existing))
    return None


def _refuse_all_damaged(resume: str, root: Path, n: int) -> None:
    """Starting over silently would overwrite the checkpoints and the metrics of the run they belong to."""
    raise UserError("--resume", resume, f"{root} holds {n} checkpoint{'s' if n != 1 else ''} and none is intact "
                    "(`shoal ckpt inspect` says why); resume from a good copy with --resume PATH, or start over "
                    "with another --out")


def _refuse_existing(root: Path) -> None:
    """Starting over next to another run's checkpoints would mix them (and `auto` would later pick theirs)."""
    if existing := list_checkpoints(root):
        raise UserError("--resume", "never", f"{root} already holds checkpoints (newest: step {existing[-1][0]}); "
                        "continue with --resume auto, or pick another --out or checkpoint.dir")
