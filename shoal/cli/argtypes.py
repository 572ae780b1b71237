"""Argument types and output checks: a bad value is refused with one line and exit 2, before any work.

Every numeric flag of every command goes through one of these, so `--nproc -3`, `--tokens nan` or
`--temperature inf` never reach the code that would misuse them; every name or path flag that must
not be empty goes through non_empty. argparse prints "shoal CMD: error: argument --FLAG: <message>",
which names the flag; the message names the value.

Every flag or config field naming an output location goes through check_output_dir or
check_output_file before the command builds, spawns or writes anything. A folder a command fills
with files of its own names (a report, figures, a benchmark) names them (`own`), and a file it
writes names how its earlier output begins (`replaces`): anything else already there is refused,
not overwritten or mixed in.
"""

from __future__ import annotations

import argparse
import math


def _int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not -2**63 < value < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is out of range")
    return value


def _float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def int_at_least(low: int, what: str = ""):
    """An integer >= low; `what` says what the smallest value means (e.g. '0: no restarts')."""
    def parse(text: str) -> int:
        value = _int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}{f' ({what})' if what else ''}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"  # argparse names the type in some messages
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def float_at_least(low: float, *, strict: bool = False, what: str = "", most: float = math.inf):
    """A finite number >= low (> low with strict), and at most `most`."""
    def parse(text: str) -> float:
        value = _float(text)
        if value < low or (strict and value == low) or value > most:
            bound = f"> {low:g}" if strict else f">= {low:g}"
            bound += f" and <= {most:g}" if most < math.inf else ""
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}{f' ({what})' if what else ''}, got {text!r}")
        return value
    parse.__name__ = f"number >= {low:g}"
    return parse


positive_float = float_at_least(0, strict=True)
nonnegative_float = float_at_least(0)


def non_empty(example: str, sep: str = ""):
    """A name or path that must not be empty: `--report ""` would otherwise read as "not given" (or as
    the current folder). With sep, a list of sep-separated items of which at least one is not blank."""
    def parse(text: str):
        items = [x.strip() for x in text.split(sep) if x.strip()] if sep else [text] if text.strip() else []
        if not items:
            raise argparse.ArgumentTypeError(f"must not be empty, got {text!r}; leave the flag out, or give "
                                             f"e.g. {example}")
        return items if sep else text
    parse.__name__ = "non-empty value"
    return parse


def check_output_dir(flag: str, path: str, *, shown: str | None = None, own: tuple[str, ...] | None = None) -> None:
    """A folder a command will write into (or a config field naming one): not empty, not a file, not
    under a file, and creatable or writable where it is. Checked before any work, creating nothing:
    the probe is a temporary folder made and removed in the nearest existing ancestor, because
    permission bits do not stop root while a read-only mount or /proc still do. `shown`: the value
    the user gave, when `path` was derived from it (the folder of a file). `own`: the names (glob
    patterns) the command writes there; given, the folder must be new, empty or hold only those (its
    earlier output, which it replaces)."""
    import os
    import tempfile

    from shoal.errors import UserError

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
        os.rmdir(tempfile.mkdtemp(prefix=".shoal-probe-", dir=existing))
    except OSError as e:
        what = f"{existing} is not writable" if existing == p else f"cannot be created in {existing}"
        raise UserError(flag, shown, f"{what} ({e.strerror}); pick a folder you can write to") from None
    if own is not None and existing == p:
        _check_only_own(flag, shown, p, own)


def _check_only_own(flag: str, shown: str, folder: str, own: tuple[str, ...]) -> None:
    """Anything in `folder` not named like the command's own output would be overwritten where its
    name is one of the command's, or mixed with it: refused, naming the first few. An empty folder
    holds nothing to overwrite (and a start that died early leaves one: train's checkpoints/)."""
    import fnmatch
    import os

    from shoal.errors import UserError
    from shoal.report.html import is_shoal_page

    def ours(name: str) -> bool:
        path = os.path.join(folder, name)
        if os.path.isdir(path) and not os.path.islink(path) and not _listing(path):
            return True
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in own):
            return False
        # index.html is too common a name to trust: only a page shoal rendered is its earlier output
        return not name.endswith(".html") or is_shoal_page(path)

    try:
        foreign = sorted(name for name in os.listdir(folder) if not ours(name))
    except OSError as e:
        raise UserError(flag, shown, f"cannot be listed ({e.strerror}); pick a folder you can read") from None
    if foreign:
        raise UserError(flag, shown, f"is a folder with other files in it ({', '.join(foreign[:3])}"
                                     f"{', ...' if len(foreign) > 3 else ''}); give a new or empty folder")


def read_input_file(field: str, path, give: str) -> bytes:
    """The bytes of a file a command reads (a recipe, a hardware TOML, a carbon trace). Missing, a
    folder, a pipe or a device (reading one blocks, or never ends: /dev/zero), a symlink loop or no
    permission: one UserError each, naming the field. `give` completes "give ...", e.g. "a .toml file"."""
    import os
    import stat

    from shoal.errors import UserError

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


def _check_name_lengths(flag: str, shown: str, existing: str, below: str) -> None:
    """The names still to be made under `existing`: none longer than its filesystem allows (255 bytes
    on most), which os.path.exists reports as missing and only the write would fail on."""
    import os

    from shoal.errors import UserError

    try:
        most = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    for name in below.split(os.sep):
        if len(os.fsencode(name)) > most:
            raise UserError(flag, shown, f"has a name of {len(os.fsencode(name))} bytes ({name[:16]}...), more than "
                                         f"the {most} its filesystem allows; pick a shorter one")


def check_output_file(flag: str, path: str, *, replaces: str | None = None) -> None:
    """A file a command will write: not empty, not a folder, in a folder that can be written (or created).
    `replaces`: a mark the command's own files carry in their first HEAD_BYTES (a recipe's header
    comment, an SVG's creator); given, an existing file without it (a user's own) is refused rather
    than overwritten."""
    import os

    from shoal.errors import UserError

    if not str(path).strip():
        raise UserError(flag, path, "is empty; give a file name")
    p = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(p) or path.endswith(("/", os.sep)):
        raise UserError(flag, path, "is a folder; give a file name")
    if os.path.exists(p) and not os.access(p, os.W_OK):
        raise UserError(flag, path, "is not writable; pick another file name")
    if replaces is not None and os.path.isfile(p) and not _head_holds(p, replaces):
        raise UserError(flag, path, "is an existing file shoal did not write; pick a new file name")
    check_output_dir(flag, os.path.dirname(p), shown=path)
    _check_name_lengths(flag, path, os.path.dirname(p), os.path.basename(p))


def _listing(folder: str) -> list[str]:
    import os

    try:
        return os.listdir(folder)
    except OSError:  # unreadable: not known to be empty
        return ["?"]


HEAD_BYTES = 4096


def _head_holds(path: str, mark: str) -> bool:
    try:
        with open(path, "rb") as f:
            return mark.encode() in f.read(HEAD_BYTES)
    except OSError:  # unreadable: not known to be ours
        return False
