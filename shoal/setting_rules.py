"""Rules on settings beside the layout's shape, which `shoal train` and `shoal plan` both apply: the
slow-link settings' ranges, and settings that act only when another one turns them on (a value other
than their default is then a mistake the user would not otherwise see)."""

from __future__ import annotations

from shoal.errors import UserError
from shoal.layout import config_name


def slow_link_setting_problems(topk_density: float, powersgd_rank: int, diloco_inner_steps: int,
                               diloco_overlap_steps: int, name=config_name) -> list[UserError]:
    """The ranges of the slow-link settings `shoal train` and `shoal plan` both take; `name` spells a
    field the way the caller's user writes it (parallel.topk_density, or --topk-density)."""
    h, tau = diloco_inner_steps, diloco_overlap_steps
    out = []
    if not 0 < topk_density <= 1:
        out.append(UserError(name("topk_density"), topk_density,
                             "must be in (0, 1], e.g. 0.1 (the share of gradient values sent each step)"))
    if powersgd_rank < 1:
        out.append(UserError(name("powersgd_rank"), powersgd_rank, "must be >= 1, e.g. 4"))
    if h < 0:
        out.append(UserError(name("diloco_inner_steps"), h, "must be >= 0 (0: off), e.g. 50"))
    elif tau and not 0 < tau < h:
        out.append(UserError(name("diloco_overlap_steps"), tau,
                             f"must be from 1 to {name('diloco_inner_steps')}-1={h - 1} (a fragment's outer step "
                             f"lands before its next sync), or 0 (off)" if h else
                             f"needs {name('diloco_inner_steps')} > 0 (DiLoCo on)"))
    return out


ENABLED_BY = {
    # A setting that acts only when another one turns it on: (that one, what turns it on: a value,
    # or "> n"). Off, the setting changes nothing, so a value other than its default is a mistake
    # the user would not otherwise see: `ignored_settings` says so for `shoal train` and `shoal plan`.
    "topk_density": ("grad_compression", "topk"), "topk_warmup": ("grad_compression", "topk"),
    "powersgd_rank": ("grad_compression", "powersgd"), "powersgd_warmup": ("grad_compression", "powersgd"),
    **{f"diloco_{name}": ("diloco_inner_steps", "> 0")
       for name in ("outer_lr", "outer_momentum", "fragments", "quantize", "overlap_steps")},
    **{f"pp_{name}": ("pp", "> 1") for name in ("schedule", "microbatches", "virtual_stages", "lighter_edges")},
    "sequence_parallel": ("tp", "> 1"),
    "checkpoint.async_save": ("checkpoint.every", "> 0"),  # not the layout's, but the same kind of switch
    "train.fp8_recipe": ("train.precision", "fp8"),
    "fp8_gather": ("precision", "fp8"),  # the planner's --fp8-gather (planner/workload.py)
    "train.loss_scale": ("train.precision", "fp16"), "train.loss_scale_window": ("train.precision", "fp16"),
}


def ignored_settings(given: dict, defaults: dict, name=config_name) -> list[str]:
    """One line for each setting in `given` (field -> value) that differs from its default while what
    turns it on (ENABLED_BY) is off. A switch missing from `given` or None (the planner searches
    it) judges nothing. `name` spells a field as the caller's user writes it."""
    lines = []
    for field, (switch, on) in ENABLED_BY.items():
        value, state = given.get(field), given.get(switch)
        if value is None or state is None or value == defaults.get(field):
            continue
        if state > int(on[1:]) if on.startswith(">") else state == on:
            continue
        lines.append(f"{name(field)}={value} has no effect: it acts only with {name(switch)}"
                     f"{' ' + on if on.startswith('>') else '=' + on} (here {state}); leave it out or set {name(switch)}")
    return lines
