"""Argument types for numeric flags: a bad number is refused by argparse with one line and exit 2.

Every numeric flag of every command goes through one of these, so `--nproc -3`, `--tokens nan` or
`--temperature inf` never reach the code that would misuse them. argparse prints
"shoal CMD: error: argument --FLAG: <message>", which names the flag; the message names the value.
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


def float_at_least(low: float, *, strict: bool = False, what: str = ""):
    """A finite number >= low (> low with strict)."""
    def parse(text: str) -> float:
        value = _float(text)
        if value < low or (strict and value == low):
            bound = f"> {low:g}" if strict else f">= {low:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}{f' ({what})' if what else ''}, got {text!r}")
        return value
    parse.__name__ = f"number >= {low:g}"
    return parse


positive_float = float_at_least(0, strict=True)
nonnegative_float = float_at_least(0)


def check_output_dir(flag: str, path: str) -> None:
    """A folder a command will write into: it, or its nearest existing ancestor, must be a writable
    folder. Checked before any work, without creating anything."""
    import os

    from shoal.errors import UserError

    p = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(p) and not os.path.isdir(p):
        raise UserError(flag, path, "is a file, not a folder; give a folder to write into")
    while not os.path.exists(p):
        p = os.path.dirname(p)
    if not os.path.isdir(p):
        raise UserError(flag, path, f"{p} is a file, so the folder cannot be created there; pick another path")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UserError(flag, path, f"{p} is not writable; pick a folder you can write to")


def check_output_file(flag: str, path: str) -> None:
    """A file a command will write: not a folder, in a folder that can be written (or created)."""
    import os

    from shoal.errors import UserError

    p = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(p) or path.endswith(("/", os.sep)):
        raise UserError(flag, path, "is a folder; give a file name, e.g. recipes/plan.toml")
    if os.path.exists(p) and not os.access(p, os.W_OK):
        raise UserError(flag, path, "is not writable; pick another file name")
    check_output_dir(flag, os.path.dirname(p))
