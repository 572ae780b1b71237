"""A catalog entry with some fields changed, checked: `--hw FIELD=VALUE` and a --hw-file's fields
(lookup.load_hw_file). Each value is converted to its field's type; a unit mix-up, a negative, an
efficiency above 1, a switch other than 0 or 1 or FP8 GEMMs past their peak is refused in one line naming
the field."""

from __future__ import annotations

import dataclasses
import difflib
import math

from shoal.errors import UserError
from shoal.hardware.gpu import GPU

_FIELDS = {f.name: f for f in dataclasses.fields(GPU)}


_ZERO_ALLOWED = {"reserved_bytes", "peak_fp32_flops", "peak_fp8_flops", "kernel_gap", "kernel_gap_one_process",
                 "host_op_cost", "host_gemm_cost",
                 "tp_kernel_overhead", "tp_redistribute_latency", "tp_redistribute_per_byte", "power_watts",
                 "power_limit_watts", "nodes_per_leaf", "overlap_cost", "ring_overlap_cost", "tp_overlap", "torus_dims",
                 "allocator_slack", "xla_step", "usd_per_gpu_hour", "flash2_attention_efficiency", "attention_score_cost"}
"""Fields where 0 means "none" or "not set" (see each field's docstring); every other number is > 0."""

_SWITCHES = {"xla_step", "tp_overlap"}
"""Fields that are on (1) or off (0): the planner tests them for truth, so tp_overlap=0.5 planned the whole
overlap and xla_step=5 an XLA program, neither said."""

_UNITS = {  # field suffix or name -> (smallest and largest plausible nonzero value, the unit with an example)
    "_flops": (1e8, 1e17, "FLOP/s: 989 TFLOP/s is 989e12"),
    "_bandwidth": (1e5, 1e14, "bytes/s: 400 Gb/s is 50e9, 900 GB/s is 900e9"),
    "_latency": (1e-8, 1.0, "seconds: 5 us is 5e-6"),
    "kernel_gap": (1e-8, 1.0, "seconds: 2 us is 2e-6"),
    "host_op_cost": (1e-8, 1.0, "seconds: 8 us is 8e-6"),
    "host_gemm_cost": (1e-8, 1.0, "seconds: 29 us is 29e-6"),
    "_per_byte": (1e-15, 1e-6, "seconds per byte: 1 ms per MiB is 9.5e-10"),
    "hbm_bytes": (2**27, 2**45, "bytes: 80 GB is 80e9"),
    "reserved_bytes": (2**20, 2**45, "bytes: 2.5 GiB is 2.5 * 2**30 = 2684354560"),
}
"""What a unit mix-up looks like (hbm_bytes=80 meant as GB plans a GPU of 80 bytes): values outside
these ranges are refused with the unit spelled out. The ranges are a thousand times wider than any
hardware in the catalog or the measured `local` entry in each direction."""


def _unit_of(key: str):
    return _UNITS.get(key) or next((v for suffix, v in _UNITS.items() if suffix.startswith("_") and key.endswith(suffix)),
                                   None)


_MAX_INT_FIELD = 2**31
"""Counts (gpus_per_node, nodes_per_leaf) past this are typos, and the planner loops over divisors."""


def _field_value(name: str, kind: str, raw: object):
    """`raw` as a hardware field of this kind: a string, or a finite number >= 0 (whole for int fields)."""
    if kind == "str":
        if not isinstance(raw, str):  # a TOML table or number where a name goes
            raise UserError(name, raw, "must be a string, e.g. name = \"my-gpu\"")
        return raw
    if isinstance(raw, bool):  # TOML true is not 1 GPU per node
        raise UserError(name, raw, f"must be a number ({kind})")
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise UserError(name, raw, f"must be a number ({kind})") from None
    if not math.isfinite(value) or value < 0:  # float("nan") and "1e400" parse; both plan nonsense
        raise UserError(name, raw, "must be a finite number >= 0")
    if kind == "int":
        if value != int(value) or value > _MAX_INT_FIELD:
            raise UserError(name, raw, f"must be a whole number up to {_MAX_INT_FIELD}")
        return int(value)
    return value


def apply_overrides(gpu: GPU, overrides: dict[str, object], *, source: str = "hw") -> GPU:
    """A copy of `gpu` with some fields replaced; values are checked and converted to the field's type."""
    changes = {}
    for key, raw in overrides.items():
        if key not in _FIELDS:
            close = difflib.get_close_matches(key, _FIELDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(f"{source}.{key}", raw, f"{hint}unknown hardware field; known: {', '.join(_FIELDS)}")
        value = _field_value(f"{source}.{key}", _FIELDS[key].type, raw)
        if isinstance(value, str) and not value.strip():  # printed in every plan's header and table
            raise UserError(f"{source}.{key}", raw, "may not be empty; e.g. name=my-h100")
        if key.endswith("_efficiency") and not (0 < value <= 1 or value == 0 and key in _ZERO_ALLOWED):
            raise UserError(f"{source}.{key}", raw, "an efficiency is a fraction in (0, 1]")
        if key in _SWITCHES and value not in (0, 1):
            raise UserError(f"{source}.{key}", raw, "is a switch: 1 (on) or 0 (off)")
        if key in ("overlap_cost", "ring_overlap_cost") and value > 1:
            raise UserError(f"{source}.{key}", raw, "a share of the collective's time, in [0, 1]")
        if key not in _ZERO_ALLOWED and value == 0:
            raise UserError(f"{source}.{key}", raw, "must be positive")
        unit = _unit_of(key)
        if unit and value and not unit[0] <= value <= unit[1]:
            raise UserError(f"{source}.{key}", raw, f"implausible: this field is in {unit[2]}")
        changes[key] = value
    new = dataclasses.replace(gpu, **changes)
    fp8_share = new.matmul_efficiency * new.fp8_matmul_ratio
    if fp8_share > 1:  # fp8_matmul_ratio=50 planned FP8 GEMMs at 36x the FP8 peak (MFU 106%)
        key = "fp8_matmul_ratio" if "fp8_matmul_ratio" in changes else "matmul_efficiency"
        raise UserError(f"{source}.{key}", overrides[key], f"an FP8 GEMM would run at {fp8_share:.0%} of the FP8 peak "
                        "(matmul_efficiency x fp8_matmul_ratio); keep the product at most 1, e.g. fp8_matmul_ratio=0.91")
    return new


def parse_hw_flags(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError("hw", pair, "write FIELD=VALUE, e.g. --hw inter_node_bandwidth=25e9")
        key, value = pair.split("=", 1)
        out[key.strip()] = value.strip()
    return out
