"""Write a plan as a recipe `shoal train` runs unchanged: the trainer's sections and field names.

The plan's layout is the trainer's (shoal/layout.py), so it is written field by field as it is:
`parallel.*`, plus `train.micro_batch` and `train.activation_checkpoint`.
"""

from __future__ import annotations

import math
from dataclasses import fields
from pathlib import Path

from shoal.errors import UserError
from shoal.model.config import PRESETS
from shoal.planner.evaluate import Plan
from shoal.hardware.gpu import GiB
from shoal.layout import CONFIG_FIELD

TRAINER_DEFAULT_PRESET = "tiny"
"""What shoal train's [model] section starts from when it names no preset."""

MODEL_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "mlp",
                "n_experts", "top_k", "expert_ffn_hidden", "n_shared_experts")


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def recipe_sections(plan: Plan, preset: str | None = None, tokens: float | None = None) -> dict[str, dict]:
    cfg, lay, wl = plan.workload.model, plan.layout, plan.workload
    limit = plan.trainer_limit
    if limit:
        raise UserError(limit.field, limit.value, f"cannot emit a recipe: {limit.fix}")
    if preset is not None and preset in PRESETS:
        # The preset plus whatever the plan changed in it.
        base = PRESETS[preset]
        model = {"preset": preset}
        model.update({f.name: getattr(cfg, f.name) for f in fields(cfg)
                      if f.name != "note" and getattr(cfg, f.name) != getattr(base, f.name)})
    else:
        # The trainer lays [model] fields over its default preset, so also write every field that
        # differs from that one.
        base = PRESETS[TRAINER_DEFAULT_PRESET]
        model = {name: getattr(cfg, name) for name in MODEL_FIELDS}
        if not cfg.is_moe:
            for name in ("n_experts", "top_k", "expert_ffn_hidden", "n_shared_experts"):
                model.pop(name)
        model.update({f.name: getattr(cfg, f.name) for f in fields(cfg)
                      if f.name not in model and f.name != "note" and getattr(cfg, f.name) != getattr(base, f.name)})
    if wl.seq_len > cfg.max_seq_len:
        model["max_seq_len"] = wl.seq_len  # the trainer refuses sequences longer than the model's
    parallel = {f.name: getattr(lay, f.name) for f in fields(lay) if f.name not in CONFIG_FIELD}
    train = {f.split(".")[1]: getattr(lay, name) for name, f in CONFIG_FIELD.items()}
    train.update(global_batch=wl.global_batch, seq_len=wl.seq_len, precision=wl.precision)
    if wl.kernels == "fused" and lay.pp_schedule != "zero-bubble":
        train["compile"] = True  # the fused layer the memory was planned for (planner/workload.py `kernels`)
    if tokens:
        train["steps"] = math.ceil(tokens / wl.tokens_per_step)
    sections = {"model": model, "parallel": parallel, "train": train}
    if wl.document_mask:
        sections["data"] = {"document_mask": True}
    return sections


EMITTED = "# Emitted by `shoal plan`"
"""How every emitted recipe begins: `--emit` replaces such a file, never a recipe a person wrote."""


def recipe_text(plan: Plan, preset: str | None = None, tokens: float | None = None) -> str:
    g = plan.cluster
    lines = [
        f"{EMITTED} for {g.n_gpus} x {g.gpu.name} ({g.gpus_per_node} per node).",
        f"# Predicted: {plan.time.step:.3g} s/step, {plan.tokens_per_s:,.0f} tokens/s, MFU {plan.mfu:.1%}, "
        f"{plan.memory.total / GiB:.1f} GiB of {plan.memory.capacity / GiB:.0f} GiB per GPU.",
    ]
    for section, values in recipe_sections(plan, preset, tokens).items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def write_recipe(path: str | Path, plan: Plan, preset: str | None = None, tokens: float | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(recipe_text(plan, preset, tokens))
    return path
