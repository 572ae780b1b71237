"""Where checkpoints live and which one a run starts from (`--resume auto|never|PATH`). No torch here."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.checkpoint import store
from shoal.errors import UserError


def checkpoint_root(cfg, out: Path) -> Path:
    """checkpoint.dir (a relative one lies inside the output directory), or <out>/checkpoints."""
    configured = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else Path("checkpoints")
    return configured if configured.is_absolute() else Path(out) / configured


def restart_count() -> int:
    """How many times the elastic agent has restarted this job's workers (0 outside an agent)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def choose_checkpoint(resume: str, root: Path) -> Path | None:
    """`auto`: the newest intact checkpoint under root (None if there is none); `never`: None;
    anything else: that checkpoint directory, or the newest intact one in that checkpoint root.

    After an elastic restart the run always continues from its own newest checkpoint, if it has one.
    """
    if resume == "never" and not restart_count():
        _refuse_existing(root)
        return None
    if resume in ("auto", "never"):
        return store.newest_valid(root)
    if restart_count() and (newest := store.newest_valid(root)) is not None:
        return newest
    path = Path(resume)
    if path.is_dir() and not (path / store.MANIFEST).exists() and store.list_checkpoints(path):
        chosen = store.newest_valid(path)
        if chosen is None:
            raise UserError("--resume", resume, "holds checkpoints, but none is intact (see the messages above)")
        return chosen
    found = store.problems(path) if path.is_dir() else [f"{path} is not a directory"]
    if found:
        raise UserError("--resume", resume, f"is not an intact shoal checkpoint: {found[0]}")
    step = store.read_train_state(path)["step"]
    newer = [s for s, p in store.list_checkpoints(root) if s > step and p.resolve() != path.resolve()]
    if newer:  # this run's saves would interleave with another timeline's, and `auto` would pick theirs
        raise UserError("--resume", resume, f"is step {step}, but {root} already holds later checkpoints "
                        f"(steps {', '.join(map(str, newer))}); resume into another --out or checkpoint.dir")
    return path


def check_resume(cfg, out: Path, resume: str) -> None:
    """--resume mistakes, found before any worker starts (restarted workers skip this)."""
    if restart_count() or int(os.environ.get("RANK", "0")) != 0:
        return
    root = checkpoint_root(cfg, out)
    if root.exists() and not root.is_dir():  # found here, not by the first save minutes into the run
        raise UserError("checkpoint.dir", str(root), "is a file, not a folder; give a folder for the checkpoints")
    if resume == "never":
        _refuse_existing(root)
    if resume not in ("auto", "never") and not Path(resume).is_dir():
        raise UserError("--resume", resume, "no such directory; pass auto, never, or a checkpoint directory "
                        f"(e.g. {root}/step_00000100)")
    if resume not in ("auto", "never") and (Path(resume) / store.MANIFEST).exists():
        # sizes and shapes now, cheaply; checksums when it is loaded
        if found := store.problems(Path(resume), checksums=False):
            raise UserError("--resume", resume, f"is not an intact shoal checkpoint: {found[0]}")


def _refuse_existing(root: Path) -> None:
    """Starting over next to another run's checkpoints would mix them (and `auto` would later pick theirs)."""
    if existing := store.list_checkpoints(root):
        raise UserError("--resume", "never", f"{root} already holds checkpoints (newest: step {existing[-1][0]}); "
                        "continue with --resume auto, or pick another --out or checkpoint.dir")
