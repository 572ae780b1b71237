"""Every name shoal writes in an output folder, spelled once, and what a folder holds by them."""

from __future__ import annotations

import re
from pathlib import Path

LOCK = ".lock"
JOB = "job.json"
RUN_INFO = "run.json"
METRICS = "metrics.jsonl"
MODEL = "model"
CHECKPOINTS = "checkpoints"
REPORT = "report"

MODEL_WEIGHTS, MODEL_CONFIG = "model.safetensors", "shoal_model.json"
"""The files of a saved model (a run's model/, shoal/checkpoint/weights.py)."""
MANIFEST = "manifest.json"
"""Written last into a checkpoint: the mark of a committed one (shoal/checkpoint/store.py)."""
EXPORT_MARK = "shoal_checkpoint.json"
"""Written by `shoal ckpt export` beside the Hugging Face files: where they came from."""
HF_EXPORT = "a Hugging Face export"

_STEP_DIR = re.compile(r"step_(\d{8,})")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def replica_dir(out: Path, group: int) -> Path:
    """Where replica group `group` writes its run: group 0 into --out itself."""
    return out if group == 0 else out / f"replica-{group}"


def inside(path: Path, root: Path) -> bool:
    """Does `path` (following symlinks) lie inside `root`?"""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of the committed-looking checkpoints directly under root, oldest first (not yet
    verified): real folders (not symlinks) inside the root, named step_N."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _STEP_DIR.fullmatch(entry.name)
        if m and entry.is_dir() and not entry.is_symlink() and inside(entry, root):
            found.append((int(m.group(1)), entry))
    return sorted(found)


def step_of_dir(folder: Path) -> int | None:
    """The step a checkpoint folder's name says, or None for another name."""
    m = _STEP_DIR.fullmatch(folder.name)
    return int(m.group(1)) if m else None


def what_shoal_wrote(folder: Path) -> str | None:
    """What of shoal's a folder holds, for commands about to write into it: "a checkpoint", "a saved
    model", HF_EXPORT, "a run directory", "a checkpoint root", or None."""
    try:
        if (folder / MANIFEST).exists():
            return "a checkpoint"
        if (folder / MODEL_CONFIG).exists():
            return "a saved model"
        if (folder / EXPORT_MARK).exists():
            return HF_EXPORT
        if (folder / RUN_INFO).exists() or (folder / METRICS).exists():
            return "a run directory"
        return "a checkpoint root" if list_checkpoints(folder) else None
    except OSError:  # unreadable: the write checks say so
        return None
