"""Files and folders a command reads or writes: every guard in one place, before any work.

Every flag or config field naming an output location goes through check_output_dir or
check_output_file before the command builds, spawns or writes anything. A folder a command fills
with files of its own names (a report, figures, a benchmark) names them (`own`), and a file it
writes names the mark its own files carry (`replaces`): anything else already there is refused, not
overwritten or mixed in. Every file a command reads (a recipe, a hardware TOML, a carbon trace, a
tokenizer) goes through read_input_file, so a folder, a pipe or a device is one line, not a hang.

The ground floor: imports nothing of shoal's but errors.py, and no torch.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from shoal.errors import UserError

HEAD_BYTES = 4096
"""How far into a file its mark is looked for (a recipe's header comment, an SVG's creator, a page's title)."""


def carries_mark(path, mark: str) -> bool:
    """Whether the file's first HEAD_BYTES hold `mark`: shoal wrote it, so a new output may replace it.
    Unreadable: not known to be ours."""
    try:
        with open(path, "rb") as f:
            return mark.encode() in f.read(HEAD_BYTES)
    except OSError:
        return False


def read_input_file(field: str, path, give: str) -> bytes:
    """The bytes of a file a command reads. Missing, a folder, a pipe or a device (reading one blocks,
    or never ends: /dev/zero), a symlink loop or no permission: one UserError each, naming the field.
    `give` completes "give ...", e.g. "a .toml file"."""
    name = str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(field, name, f"no such file; give {give}") from None
    except OSError as e:  # a symlink loop, a path through a file, no permission on a folder
        raise UserError(field, name, f"cannot be read ({e.strerror}); give {give}") from None
    if stat.S_ISDIR(mode):
        raise UserError(field, name, f"is a directory; give {give}")
    if not stat.S_ISREG(mode):
        raise UserError(field, name, f"is not a regular file (a pipe or a device); give {give}")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise UserError(field, name, f"cannot be read ({e.strerror}); check its permissions") from None


def read_toml(field: str, path, give: str, parse_float=float) -> dict:
    """The tables of a TOML file a command reads (read_input_file's checks first); not UTF-8 or not
    TOML is one UserError naming the field. A byte-order mark (some Windows editors) is no mistake."""
    raw = read_input_file(field, path, give)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(field, str(path), f"is not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); "
                                          f"give {give}") from None
    try:
        return tomllib.loads(text, parse_float=parse_float)
    except tomllib.TOMLDecodeError as e:
        raise UserError(field, str(path), f"is not valid TOML ({e}); give {give}") from None


def check_output_dir(flag: str, path: str, *, shown: str | None = None, own: tuple | None = None,
                     libraries: tuple[str, ...] = (), links: bool = True) -> None:
    """A folder a command will write into (or a config field naming one): not empty, not a file, not
    under a file, and creatable or writable where it is. Checked before any work, creating nothing:
    the probe is a temporary folder made and removed in the nearest existing ancestor, because
    permission bits do not stop root while a read-only mount or /proc still do. `shown`: the value
    the user gave, when `path` was derived from it (the folder of a file). `own`: the names (glob
    patterns, or (pattern, mark) for a name too common to trust without its mark) the command writes
    there; given, the folder must be new, empty or hold only those (its earlier output, which it replaces).
    `libraries`: folders in it that another library writes itself, links and all (W&B's), not looked into.
    `links`: whether the command writes all over the folder, so that no link in it may lead out (its own
    folder), or one file into it (check_output_file), which looks at that file alone."""
    shown = path if shown is None else shown
    if not str(path).strip():
        raise UserError(flag, shown, "is empty; name a folder to write into")
    p = os.path.abspath(os.path.expanduser(path))
    existing = p
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = ("is a file, not a folder" if existing == p and shown == path
                 else f"lies under {existing}, which is a file")
        raise UserError(flag, shown, f"{where}; pick another path")
    _check_name_lengths(flag, shown, existing, os.path.relpath(p, existing))
    try:
        os.rmdir(tempfile.mkdtemp(prefix=PROBE_PREFIX, dir=existing))
    except OSError as e:
        what = f"{existing} is not writable" if existing == p else f"cannot be created in {existing}"
        raise UserError(flag, shown, f"{what} ({e.strerror}); pick a folder you can write to") from None
    if own is not None and existing == p:
        _check_only_own(flag, shown, p, own)
    if existing == p and links:
        _check_no_link_out(flag, shown, p, libraries)


PROBE_PREFIX = ".shoal-probe-"
"""The temporary names shoal makes to learn whether a folder can be written (here and in
worker/shared_dir.py); one left behind by a killed process is no one's file."""


def check_output_file(flag: str, path: str, *, replaces: str | None = None) -> None:
    """A file a command will write: not empty, not a folder, in a folder that can be written (or created).
    `replaces`: the mark the command's own files carry (carries_mark); given, an existing file without
    it (a user's own) is refused rather than overwritten."""
    if not str(path).strip():
        raise UserError(flag, path, "is empty; give a file name")
    p = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(p) or path.endswith(("/", os.sep)):
        raise UserError(flag, path, "is a folder; give a file name")
    if os.path.exists(p) and not os.access(p, os.W_OK):
        raise UserError(flag, path, "is not writable; pick another file name")
    if os.path.islink(p):  # written through, it would replace whatever the link points at
        raise UserError(flag, path, f"is a symbolic link (to {os.path.realpath(p)}); give a new file name")
    if replaces is not None and os.path.isfile(p) and not carries_mark(p, replaces):
        raise UserError(flag, path, "is an existing file shoal did not write; pick a new file name")
    # One file is written: a link elsewhere in its folder (a project's .venv, another tool's file in /tmp)
    # is no concern of it, and refusing one refused `--emit plan.toml` in any folder that held a link.
    check_output_dir(flag, os.path.dirname(p), shown=path, links=False)
    _check_name_lengths(flag, path, os.path.dirname(p), os.path.basename(p))


def _check_only_own(flag: str, shown: str, folder: str, own: tuple) -> None:
    """Anything in `folder` not named like the command's own output would be overwritten where its
    name is one of the command's, or mixed with it: refused, naming the first few. An empty folder
    holds nothing to overwrite (and a start that died early leaves one: train's checkpoints/)."""
    def ours(name: str) -> bool:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path) and not _listing(path):
            return True
        for entry in own:
            pattern, mark = entry if isinstance(entry, tuple) else (entry, None)
            if fnmatch.fnmatchcase(name, pattern):
                return mark is None or carries_mark(path, mark)
        return False

    try:
        foreign = sorted(name for name in os.listdir(folder) if not ours(name))
    except OSError as e:
        raise UserError(flag, shown, f"cannot be listed ({e.strerror}); pick a folder you can read") from None
    if foreign:
        raise UserError(flag, shown, f"is a folder with other files in it ({', '.join(foreign[:3])}"
                                     f"{', ...' if len(foreign) > 3 else ''}); give a new or empty folder")


LINK_DEPTH, LINK_ENTRIES = 4, 100_000
"""How deep into an output folder links are looked for (a run's replica-K/checkpoints/step_N/file),
and in how many entries at most (a checkpoint.dir on a shared disk may hold much else)."""


def _check_no_link_out(flag: str, shown: str, folder: str, libraries: tuple[str, ...] = ()) -> None:
    """A symbolic link in an output folder that leads out of it (a run's .lock, model/shoal_model.json,
    checkpoints/): writing through it would overwrite or fill whatever it points at, so the command
    writes through no link out of the folder it was given, and refuses one found there."""
    real, seen = os.path.realpath(folder), 0
    for parent, dirs, files in os.walk(folder):
        if parent[len(folder):].count(os.sep) >= LINK_DEPTH:
            dirs[:] = []
        inside = [d for d in dirs if parent != folder or d not in libraries]  # each checked, not walked
        seen += len(dirs) + len(files)
        if seen > LINK_ENTRIES:
            return
        for name in dirs + files:
            path = os.path.join(parent, name)
            target = os.path.realpath(path)
            if os.path.islink(path) and os.path.commonpath([target, real]) != real:
                raise UserError(flag, shown, f"holds {os.path.relpath(path, folder)}, a symbolic link to {target}, "
                                             "outside it; shoal writes through no link out of the folder it writes "
                                             "into: remove the link")
        dirs[:] = inside


def _check_name_lengths(flag: str, shown: str, existing: str, below: str) -> None:
    """The names still to be made under `existing`: none longer than its filesystem allows (255 bytes
    on most), which os.path.exists reports as missing and only the write would fail on."""
    try:
        most = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    for name in below.split(os.sep):
        if len(os.fsencode(name)) > most:
            raise UserError(flag, shown, f"has a name of {len(os.fsencode(name))} bytes ({name[:16]}...), more than "
                                         f"the {most} its filesystem allows; pick a shorter one")


def _listing(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:  # unreadable: not known to be empty
        return ["?"]


def missing_parts(path: Path) -> list[Path]:
    """`path` and those of its folders that do not exist yet, deepest first: what a refusal must take
    away again to leave the disk as it found it."""
    return [p for p in (path, *path.parents) if not os.path.lexists(p)]


@contextlib.contextmanager
def filling(folder: Path) -> Iterator[Path]:
    """`folder`, created with its missing parents for the work inside to write into. When that work
    fails, what this made goes again: the folder, if it is new, with whatever was written in it, and
    then each parent made for it (rmdir: while still empty). A folder that was there is left as it is."""
    made = missing_parts(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:  # an interrupt too: half a report is no report
        if made:
            shutil.rmtree(folder, ignore_errors=True)
            for parent in made[1:]:
                with contextlib.suppress(OSError):
                    parent.rmdir()
        raise


def write_json(path: str | os.PathLike, obj: dict, durable: bool = True, default=None) -> None:
    """Write JSON under a temporary name (this host's and process's: writers may race, on several nodes
    of a shared folder) and rename it into place, so a reader sees the old file or the new one, never
    half of one. `durable` also fsyncs it first, so that a power loss cannot leave the name pointing at
    unwritten data. `default`: as json.dump's, for values JSON has no type for."""
    tmp = f"{os.fspath(path)}.{socket.gethostname()}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=default)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
