"""The run's --out: a fresh name when none is given, the checks before a run writes into it, and
the tidying when a run is refused before it wrote anything of its own."""

from __future__ import annotations

import os
import time
from pathlib import Path

from shoal.errors import UserError
from shoal.files import PROBE_PREFIX, check_output_dir
from shoal.rundir.names import JOB, LOCK, METRICS, MODEL, PROFILE, REPORT, RUN_INFO, TENSORBOARD, WANDB, what_shoal_wrote

OWN_FILES = (LOCK, JOB, METRICS, RUN_INFO)
"""The files a run keeps at the top of its --out."""
BEFORE_RUN_INFO = (LOCK, JOB + "*", "slurm-*.out", "replica-*", PROBE_PREFIX + "*", "ray", "hang_report.*", "lost+found")
"""What a fresh --out may hold besides nothing: what a start that died before writing run.json
leaves (its lock and job, replica groups, a shared-folder probe, Ray's storage, a hang report), shoal
slurm's log (sbatch opens it first), a fresh filesystem's lost+found."""
OWN_FOLDERS = (MODEL, REPORT, TENSORBOARD, WANDB, PROFILE)
"""The folders the run (its final weights, metrics backends, profiler traces) and `shoal report` (its
default --out) write into its --out."""


def checkpoint_dir_problem(inside_out: Path) -> str | None:
    """Why a checkpoint root at this path relative to the run's --out would mix with the run's own
    outputs, or None. Checkpoints there would sit among the run's files (the --out itself), be taken
    by the run's next final weights or report, or refuse those (`shoal report` into a folder of them)."""
    if not inside_out.parts:  # "." and the --out itself
        return ("is the output directory itself, where the run keeps its own files; give a folder in it, "
                "e.g. checkpoints")
    if inside_out.parts[0] in OWN_FILES + OWN_FOLDERS:
        return (f"lies in {inside_out.parts[0]}, which the run or `shoal report` writes in the output directory; "
                "pick another folder name, e.g. checkpoints")
    return None


def default_out(recipe: str | None) -> Path:
    """A fresh directory per run (`runs/<recipe>-<YYYYmmdd-HHMMSS>`), so no run silently replaces another."""
    name = Path(recipe).stem if recipe else "train"
    base = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, n = base, 1
    while out.exists():  # two runs started within one second
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def check_out(out: str, corpora: tuple[str, ...] = ()) -> Path:
    """`--out` mistakes, found before anything is built: empty, a file, under a file, not creatable,
    a folder shoal wrote that is not a run (a checkpoint, a saved model, a checkpoint root), or a
    folder inside the corpus folder `corpus`, whose next run would read this one's metrics as text,
    or one where a file the run keeps (OWN_FILES) is a folder, or for a fresh start a folder of other files
    (its model/, checkpoints/ and metrics would be mixed with them, replacing those of the same name).
    Creates the folder once every check has passed."""
    if not out.strip():
        raise UserError("--out", out, "is empty; name a directory, e.g. --out runs/first")
    path = Path(out)
    kind = what_shoal_wrote(path)
    # a file, under a file, not creatable, a name too long; for a fresh start, a folder of other files
    # W&B links its run's log files into its own cache: its folder is the library's, not written through
    check_output_dir("--out", out, own=None if kind else BEFORE_RUN_INFO, libraries=(WANDB,))
    if kind not in (None, "a run directory"):
        raise UserError("--out", out, f"holds {kind}, not a run; pick a new --out (or the run's own folder to "
                                      "continue it)")
    for name in OWN_FILES:  # written (and renamed into place) later: a folder there fails only then
        if (path / name).exists() and not (path / name).is_file():
            raise UserError("--out", out, f"holds {name} as a {'folder' if (path / name).is_dir() else 'special file'}"
                                          f", where a run keeps a file; remove {path / name} or pick another --out")
    for corpus in corpora:
        real = os.path.realpath(os.path.expanduser(corpus))
        if os.path.isdir(real) and Path(os.path.realpath(out)).is_relative_to(real):
            raise UserError("--out", out, f"lies inside the corpus {corpus}, so the next run would train on this "
                                          "one's outputs (metrics.jsonl); pick an --out outside the corpus")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError("--out", out, f"cannot be created ({e.strerror}); pick a writable directory") from None
    return path


def remove_if_untouched(out: Path, made: list[Path]) -> None:
    """A refused run leaves nothing behind: its lock, its job file and the folders it made (`made`:
    shoal.files.missing_parts of --out before it was created) go again, unless something else was
    written into them meanwhile (rmdir takes empty folders only)."""
    try:
        if any(p.name not in (LOCK, JOB) for p in out.iterdir()):
            return
        for name in (JOB, LOCK):
            (out / name).unlink(missing_ok=True)
        for folder in made:
            folder.rmdir()
    except OSError:
        return
