"""Field values as a recipe or `--set` gives them, converted to the field's type: one rule for TOML
values and command-line strings (booleans, numbers that must be finite and fit int64, TOML inline
tables for dict fields), and floats so small they would silently read as 0 refused."""

from __future__ import annotations

import math
from typing import Any

from shoal.errors import UserError

# TOML and --set integers must fit the int64 the tensors and file formats hold them in.
_INT_LIMIT = 2**63


def coerce(name: str, raw: Any, kind: type) -> Any:
    """Convert a TOML value or a --set string to the field's type; numbers must be finite and fit int64."""
    value = _convert(name, raw, kind)
    if kind is float and not math.isfinite(value):  # TOML and float() both accept nan and inf
        raise UserError(name, raw, "must be a finite number (not nan or inf)")
    if kind is int and not -_INT_LIMIT < value < _INT_LIMIT:
        raise UserError(name, raw, "is out of range for an integer field (at most 2**63-1)")
    if kind is str and "\0" in value:  # TOML's \u0000: no path, name or key holds one (the OS refuses it)
        raise UserError(name, raw, "contains a NUL character (\\u0000); remove it")
    return value


class _Underflow(str):
    """A TOML float whose nonzero digits round to 0.0 (1e-400), kept as written for _convert to refuse."""


def toml_float(text: str) -> float | _Underflow:
    value = float(text)
    return _Underflow(text) if _underflows(text, value) else value


def _underflows(text: str, value: float) -> bool:
    """Nonzero digits that read as 0.0: `train.lr=1e-400` would silently train with lr 0."""
    return value == 0 and bool(text.lower().partition("e")[0].strip("+-0._ "))


def _underflow_error(name: str, raw: str) -> UserError:
    return UserError(name, str(raw), "is too small for a floating-point number and would read as 0; give a "
                                     "larger value")


def _convert(name: str, raw: Any, kind: type) -> Any:
    if isinstance(raw, _Underflow):
        raise _underflow_error(name, raw)
    if kind is dict and isinstance(raw, str):  # --set data.mix='{"web" = 0.7, "code" = 0.3}'
        import tomllib

        try:
            table = tomllib.loads(f"value = {raw}", parse_float=toml_float)["value"]
        except tomllib.TOMLDecodeError:
            table = None
        if not isinstance(table, dict):  # a quoted string parses, and would be read as a number next
            raise UserError(name, raw, 'expected a TOML table, e.g. \'{"web" = 0.7, "code" = 0.3}\'')
        raw = table
    if isinstance(raw, str) and kind is not str:
        text = raw.strip().lower()
        if kind is bool:
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise UserError(name, raw, "expected true or false")
        try:
            value = kind(text) if kind is float else int(text)
        except ValueError:
            raise UserError(name, raw, f"expected {'a number' if kind is float else 'an integer'}") from None
        if kind is float and _underflows(text, value):
            raise _underflow_error(name, raw)
        return value
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if not isinstance(raw, kind) or (kind is int and isinstance(raw, bool)):
        raise UserError(name, raw, f"expected a value of type {kind.__name__}")
    return raw
