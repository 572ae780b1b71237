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
