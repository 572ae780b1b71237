"""Argument types: a bad value is refused with one line and exit 2, before any work.

Every numeric flag of every command goes through one of these, so `--nproc -3`, `--tokens nan` or
`--temperature inf` never reach the code that would misuse them; every name or path flag that must
not be empty goes through non_empty. argparse prints "shoal CMD: error: argument --FLAG: <message>",
which names the flag; the message names the value. (Files and folders a command reads or writes are
checked by shoal/files.py.)
"""

from __future__ import annotations

import argparse
import math


def _integer(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _int(text: str) -> int:
    value = _integer(text)
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


def int_at_least(low: int, what: str = "", most: int | None = None):
    """An integer >= low, and <= most if given; `what` says what the bounds mean (e.g. '0: no restarts')."""
    def parse(text: str) -> int:
        if most is not None:  # a bounded flag names its bounds even for a count past 2^63
            value = _integer(text)
            if not low <= value <= most:
                raise argparse.ArgumentTypeError(f"must be an integer from {low} to {most:,}"
                                                 f"{f' ({what})' if what else ''}, got {text}")
            return value
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
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}{f' ({what})' if what else ''}, "
                                             f"got {text!r}")
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


def one_of(choices: tuple[str, ...], aliases: dict[str, str], what: str):
    """A choice as people write it: any case, or another name for the same thing (a table's "FP8-MX" for fp8);
    anything else is refused with the choices."""
    def parse(text: str) -> str:
        key = text.strip().lower()
        if key in choices or key in aliases:
            return aliases.get(key, key)
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: choose from {', '.join(choices)}")
    parse.__name__ = what
    return parse


mlp_kind = one_of(("swiglu", "gelu"), {"geglu": "swiglu", "silu": "swiglu", "relu": "gelu", "relu2": "gelu",
                                       "squared-relu": "gelu", "squared_relu": "gelu"}, "an MLP kind")
"""What an MLP's activation means for its shape: gated ones have three matrices (planned as swiglu), the rest
two (planned as gelu); the FLOPs and memory are the matrices', whatever the nonlinearity between them."""
PRECISION_ALIASES = {"fp8-cs": "fp8", "fp8-mx": "fp8", "mxfp8": "fp8", "fp8-blockwise": "fp8", "fp8-delayed": "fp8",
                     "fp8-tensorwise": "fp8", "bf16-mixed": "bf16", "amp_bf16": "bf16", "fp16-mixed": "fp16",
                     "amp_fp16": "fp16", "float32": "fp32", "tf32": "fp32"}
"""Precision names of published tables and other trainers (Megatron-Bridge's FP8-CS/FP8-MX, Lightning's
bf16-mixed, Composer's amp_bf16): FP8's scaling recipes are planned alike."""
SCHEDULE_ALIASES = {"interleaved": "interleaved-1f1b", "vpp": "interleaved-1f1b", "interleaved1f1b": "interleaved-1f1b",
                    "zero-bubble-h1": "zero-bubble", "zb": "zero-bubble", "dualpipe-v": "dualpipe"}
"""Other names of the pipeline schedules (Megatron's virtual pipeline is interleaved 1F1B)."""
