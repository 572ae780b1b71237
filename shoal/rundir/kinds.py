"""Checking a record shoal wrote (a metrics row, run.json) against the kinds it writes, so that no
reader meets a string where it does arithmetic: a damaged or foreign file is one UserError.

Kinds: int, float (any JSON number: NaN is how a diverged loss is logged), str, dict, None (null), a
tuple (any of), [kind] (a list of it), {name: kind} (those fields, each optional: old runs lack the
newer ones; `str` for any other key), a dataclass (a dict of its fields only, typed like their defaults).
"""

from __future__ import annotations

import dataclasses

from shoal.errors import UserError


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


def check_fields(record: dict, kinds: dict, name: str, where: str, need: tuple[str, ...] = ()) -> None:
    """UserError for the first field of `record` (in file `name`) not of its kind, or a dotted
    path in `need` that is absent."""
    bad = _mismatch(record, kinds, "")
    if bad:
        path, value, kind = bad
        raise damaged(where, f"{name} {path}", value, _describe(kind))
    for dotted in need:
        value = record
        for key in dotted.split("."):
            value = value.get(key, _Missing()) if isinstance(value, dict) else _Missing()
        if isinstance(value, _Missing):
            raise damaged(where, f"{name} {dotted}", value, "a value (shoal train always writes it)")


def damaged(where: str, field: str, value: object, wants: str) -> UserError:
    shown = value if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return UserError(field, shown, f"expected {wants}; {where} is not a run directory as `shoal train` writes it "
                                   "(damaged or edited): give a run's --out directory, or re-run it")


def _mismatch(value, kind, path: str):
    """(dotted path, value, kind) of the first part of `value` that is not of `kind`, or None."""
    if isinstance(kind, tuple):
        return None if any(_mismatch(value, k, path) is None for k in kind) else (path, value, kind)
    if dataclasses.is_dataclass(kind):
        name, kind = kind.__name__, {f.name: object if f.default is dataclasses.MISSING else type(f.default)
                                     for f in dataclasses.fields(kind)}
        if isinstance(value, dict) and (extra := set(value) - set(kind)):
            key = sorted(extra)[0]
            return f"{path}.{key}", value[key], f"nothing: shoal's {name} has no such field"
    if isinstance(kind, list):
        if not isinstance(value, list):
            return path, value, kind
        return next(filter(None, (_mismatch(v, kind[0], f"{path}[{i}]") for i, v in enumerate(value))), None)
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            return path, value, kind
        checked = ((k, v) for k, v in value.items() if k in kind or str in kind)  # other fields: anything
        return next(filter(None, (_mismatch(v, kind.get(k, kind.get(str)), f"{path}.{k}".lstrip("."))
                                  for k, v in checked)), None)
    if kind is None:
        return None if value is None else (path, value, kind)
    if kind is float:
        kind = (int, float)
    ok = isinstance(value, kind) and (kind in (bool, object) or not isinstance(value, bool))  # true is no number
    return None if ok else (path, value, kind)


def _describe(kind) -> str:
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        return f"a list, each {_describe(kind[0])}"
    if isinstance(kind, dict):
        return "an object" + (f", each value {_describe(kind[str])}" if str in kind else "")
    if isinstance(kind, tuple) and kind != (int, float):
        return " or ".join(map(_describe, kind))
    return {int: "an integer", float: "a number", (int, float): "a number", str: "a string", bool: "true or false",
            dict: "an object", None: "null"}[kind]
