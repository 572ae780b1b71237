"""One run, one output directory: where `--out` is, checks that it is usable, and a lock on it.

Two live runs writing one directory interleave their metrics and checkpoints, so the process that
owns a run (the `shoal train --nproc N` launcher, a single process, or rank 0 under plain torchrun)
holds an exclusive flock on `<out>/.lock`, naming its pid and host inside. The kernel drops a flock
when its holder dies, however it dies, so a stale lock never needs cleaning: the next run takes it.
The launcher's own workers find the lock held by their parent (SHOAL_LAUNCHER_PID) and go ahead.
No torch here: all of it runs before anything is built.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from shoal.errors import UserError
from shoal.train.run_info import RUN_INFO

LOCK = ".lock"
OWN_FILES = (LOCK, "metrics.jsonl", RUN_INFO)
"""The files a run keeps at the top of its --out."""
BEFORE_RUN_INFO = (LOCK, "slurm-*.out", "replica-*", ".shoal-probe-*", "ray", "hang_report.*", "lost+found")
"""What a fresh --out may hold besides nothing: what a start that died before writing run.json
leaves (its lock, replica groups, a shared-folder probe, Ray's storage, a hang report), shoal
slurm's log (sbatch opens it first), a fresh filesystem's lost+found."""
OWN_FOLDERS = ("model", "report")
"""The folders the run (its final weights) and `shoal report` (its default --out) write into its --out."""


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
LAUNCHER_ENV = "SHOAL_LAUNCHER_PID"  # set by shoal/launch/local.py for the workers it starts
_held: dict[Path, int] = {}  # run directory -> the lock fd this process holds (closing it drops the lock)


def default_out(recipe: str | None) -> Path:
    """A fresh directory per run (`runs/<recipe>-<YYYYmmdd-HHMMSS>`), so no run silently replaces another."""
    name = Path(recipe).stem if recipe else "train"
    base = Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    out, n = base, 1
    while out.exists():  # two runs started within one second
        n += 1
        out = base.with_name(f"{base.name}-{n}")
    return out


def check_out(out: str, data_path: str = "") -> Path:
    """`--out` mistakes, found before anything is built: empty, a file, under a file, not creatable,
    a folder shoal wrote that is not a run (a checkpoint, a saved model, a checkpoint root), or a
    folder inside the corpus (data.path), whose next run would read this one's metrics.jsonl as text,
    or one where a file the run keeps (OWN_FILES) is a folder, or for a fresh start a folder of other files
    (its model/, checkpoints/ and metrics would be mixed with them, replacing those of the same name)."""
    from shoal.checkpoint import store
    from shoal.cli.argtypes import check_output_dir  # the one output-location check
    from shoal.data.sources import STDLIB

    if not out.strip():
        raise UserError("--out", out, "is empty; name a directory, e.g. --out runs/first")
    path = Path(out)
    kind = store.what_shoal_wrote(path)
    # a file, under a file, not creatable, a name too long; for a fresh start, a folder of other files
    check_output_dir("--out", out, own=None if kind else BEFORE_RUN_INFO)
    if kind not in (None, "a run directory"):
        raise UserError("--out", out, f"holds {kind}, not a run; pick a new --out (or the run's own folder to "
                                      "continue it)")
    for name in OWN_FILES:  # written (and renamed into place) later: a folder there fails only then
        if (path / name).exists() and not (path / name).is_file():
            raise UserError("--out", out, f"holds {name} as a {'folder' if (path / name).is_dir() else 'special file'}"
                                          f", where a run keeps a file; remove {path / name} or pick another --out")
    corpus = os.path.realpath(os.path.expanduser(data_path)) if data_path and data_path != STDLIB else ""
    if corpus and os.path.isdir(corpus) and Path(os.path.realpath(out)).is_relative_to(corpus):
        raise UserError("--out", out, f"lies inside data.path={data_path}, so the next run would train on this one's "
                                      "outputs (metrics.jsonl); pick an --out outside the corpus")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError("--out", out, f"cannot be created ({e.strerror}); pick a writable directory") from None
    return path


def lock(out: Path) -> None:
    """Take `<out>/.lock` until release(out) or this process ends, or refuse naming the live run
    that holds it. Taking it again in the process that holds it is a no-op."""
    if out.resolve() in _held:
        return
    try:
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:  # e.g. a read-only mount (permission bits alone do not stop root)
        raise UserError("--out", str(out), f"is not writable ({e.strerror}); pick a writable directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").split() or ["?", "?"]
        os.close(fd)
        raise UserError("--out", str(out), f"is in use by a running shoal train (pid {holder[0]} on host "
                        f"{holder[-1]}); wait for it or stop it, or pick another --out") from None
    with no_space_left(out / LOCK):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[out.resolve()] = fd


def release(out: Path) -> None:
    """Let go of `<out>/.lock` (an in-process caller's run is over)."""
    fd = _held.pop(out.resolve(), None)
    if fd is not None:
        os.close(fd)


def claim(out: Path) -> None:
    """Lock the run directory unless a process of this same run already holds it.

    Under the shoal launcher the launcher holds it (its workers are its children); under plain
    torchrun rank 0 takes it (one lock per run, and only rank 0 writes into --out).
    """
    if "WORLD_SIZE" in os.environ:
        if os.environ.get(LAUNCHER_ENV) == str(os.getppid()):
            return
        if os.environ.get("RANK", "0") != "0":
            return
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
            _lock_retrying(out)  # the failed attempt's rank 0 may still be on its way out
            return
    lock(out)


def _lock_retrying(out: Path, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            return lock(out)
        except UserError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# A write into the run directory can fail for reasons that are the disk's, not shoal's:
# errno -> (what it says, what to do about it on that disk).
_REFUSED = {errno.ENOSPC: ("no space left on device", "free some space"),
            errno.EDQUOT: ("disk quota exceeded", "free some space or raise the quota"),
            errno.EROFS: ("read-only file system", "remount it read-write"),
            errno.EACCES: ("permission denied", "make it writable"),
            errno.EPERM: ("operation not permitted", "make it writable (chattr -i, a read-only bind mount?)")}


class DiskFull(UserError):
    """A write into the run directory failed on its disk: full, over quota, turned read-only, or
    not writable. Says which, and which file."""

    def __init__(self, field: str, value: object, fix: str, code: int = errno.ENOSPC):
        super().__init__(field, value, fix)
        self.code = code

    def __str__(self) -> str:
        return f"{_REFUSED[self.code][0]} while writing {self.value}; {self.fix}"


@contextmanager
def no_space_left(path: Path, kept: str = "", then: str = ", or pick an --out on another disk"):
    """Turn a write that the disk refused (full, over quota, read-only, not permitted) into one line
    naming `path`: what is `kept` intact (e.g. "the checkpoints before it are intact; "), the remedy
    for that disk, and `then` (what else to do).

    Python reports ENOSPC as OSError, DCP wraps each rank's error in a CheckpointException (a
    BaseException), torch's zip writer says only "[enforce fail at inline_container.cc] unexpected
    pos ..." and safetensors "os error 28": when the words are missing, the free space decides.
    """
    try:
        yield
    except (KeyboardInterrupt, SystemExit, UserError):
        raise
    except BaseException as e:
        code = _refused_by_disk(e, path)
        if code is not None:
            raise DiskFull("--out", str(path), f"{kept}{_REFUSED[code][1]}{then}", code) from None
        raise


def errors_within(e: BaseException):
    """`e` and every error behind it: causes, contexts, and each rank's error inside DCP's
    CheckpointException (a BaseException holding {rank: (error, traceback)})."""
    pending, seen = [e], set()
    while pending:
        err = pending.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        pending += [err.__cause__, err.__context__, *(pair[0] for pair in getattr(err, "failures", {}).values())]


def _refused_by_disk(e: BaseException, path: Path) -> int | None:
    """The errno (one of _REFUSED) behind `e`, however deep DCP or safetensors wrapped it."""
    for err in errors_within(e):
        if isinstance(err, OSError) and err.errno in _REFUSED:
            return err.errno
        text = str(err)
        for code, (words, _) in _REFUSED.items():
            if words in text.lower() or f"os error {code})" in text:
                return code
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and shutil.disk_usage(existing).free < 1 << 20:  # a write failed on a full disk
        return errno.ENOSPC
    return None
