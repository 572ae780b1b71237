"""A write into the run directory that the disk refused: one line naming the file and the remedy.

Python reports ENOSPC as OSError, DCP wraps each rank's error in a CheckpointException (a
BaseException), torch's zip writer says only "[enforce fail at inline_container.cc] unexpected
pos ..." and safetensors "os error 28": when the words are missing, the free space decides.
"""

from __future__ import annotations

import errno
import shutil
from contextlib import contextmanager
from pathlib import Path

from shoal.errors import UserError

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
    for that disk, and `then` (what else to do)."""
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
