"""Plans as text (rich tables, with the reasons each layout wins or fails) and as JSON-ready dicts."""

from __future__ import annotations

import dataclasses
import math

from shoal.model.analytics import param_counts
from shoal.planner.cost import TrainingEstimate
from shoal.planner.evaluate import MEMORY_PARTS, TIME_PARTS, Plan
from shoal.hardware.gpu import GiB
from shoal.planner.workload import Cluster, Workload
from shoal.planner.scaling import ScalePoint, efficiency, knee
from shoal.planner.search import SearchResult
from shoal.planner.stacks import STACK_SETTINGS



def human(n: float, unit: str = "") -> str:
    if abs(n) >= 1e15:  # past a thousand trillion a suffix reads worse than the exponent ("8.5e+22", not "8.5e+10T")
        return f"{n:.3g}{unit}"
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}{unit}"
    return f"{n:.3g}{unit}"


def amount(n: float, decimals: int = 0) -> str:
    """A quantity with thousands separators, or as human() past a thousand trillion: `--mtbf-hours 1e300` printed
    all 301 digits of the MTBF, over four lines (and a CO2 mass of --tokens 1e300 as many)."""
    return f"{n:,.{decimals}f}" if abs(n) < 1e15 else human(n)


def duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    if seconds < 3 * YEAR:
        return f"{seconds / 86400:.1f} days"
    return f"{human(seconds / YEAR)} years"  # a run of --tokens 1e30 is 5e16 years, not 19 digits of days


YEAR = 365.25 * 86400


WORKLOAD_SETTINGS = ("kernels", "document_mask", "stack", *STACK_SETTINGS)
"""The Workload fields `--json` reports beside the batch: how the planned software runs the layer."""


def headline(workload: Workload, cluster: Cluster, model_name: str) -> str:
    counts = param_counts(workload.model)
    active = f", {human(counts.active)} active" if workload.model.is_moe else ""
    return (f"{model_name} ({human(counts.total)} params{active}) · seq {workload.seq_len} · batch "
            f"{workload.global_batch} ({human(workload.tokens_per_step)} tokens/step) · {cluster.n_gpus} x "
            f"{cluster.gpu.name} ({cluster.n_nodes} node{'s' if cluster.n_nodes > 1 else ''} of {cluster.gpus_per_node})"
            f" · {workload.attention} attention{' with document masks' if workload.document_mask else ''}"
            f" · {workload.stack or 'default'} stack settings")


def layouts_table(plans: list[Plan], title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("#", "layout", "GiB", "step", "tokens/s", "MFU", "TFLOP/s", "why"):
        table.add_column(col, justify="left" if col in ("layout", "why") else "right", no_wrap=col != "why")
    for i, p in enumerate(plans, 1):
        table.add_row(str(i), p.layout.short(), f"{p.memory.total / GiB:.1f}", duration(p.time.step),
                      human(p.tokens_per_s), f"{p.mfu:.1%}", f"{p.model_tflops_per_gpu:.3g}", "; ".join(p.reasons))
    return table


def breakdown_lines(plan: Plan) -> list[str]:
    mem, t = plan.memory, plan.time
    where = {"only": "", "first": " (first pipeline stage)", "last": " (last pipeline stage)",
             "edges": " (first pipeline rank: the first and last stages)"}[mem.stage]
    parts = [f"{name} {getattr(mem, name) / GiB:.1f}" for name in MEMORY_PARTS if getattr(mem, name) > 0]
    time_parts = [f"{name} {duration(getattr(t, name))} ({getattr(t, name) / t.step:.0%})"
                  for name in TIME_PARTS if getattr(t, name) / t.step >= 0.005]
    return [
        f"memory per GPU{where}, GiB: " + " | ".join(parts) + f" = {mem.total / GiB:.1f} of {mem.capacity / GiB:.1f}"
        + (f"; {mem.host / GiB:.1f} more in host memory (offloaded)" if mem.host else ""),
        f"step time {duration(t.step)} with {t.microbatches} micro-batch{'es' if t.microbatches > 1 else ''}: "
        + " | ".join(time_parts),
        f"throughput {human(plan.tokens_per_s)} tokens/s, MFU {plan.mfu:.1%}, HFU {plan.hfu:.1%}, "
        f"{plan.model_tflops_per_gpu:.3g} model TFLOP/s per GPU",
    ]


def training_lines(est: TrainingEstimate) -> list[str]:
    cost = ""
    if est.usd_per_gpu_hour is not None:
        cost = f", ${human(est.ideal_cost)}" + (f" (${human(est.expected_cost)} expected)" if math.isfinite(est.expected_hours) else "")
    lines = [f"training {human(est.tokens)} tokens: {duration(est.ideal_hours * 3600)} with no failures{cost}"]
    if math.isfinite(est.expected_hours):
        lines.append(f"with a failure every {duration(est.job_mtbf_hours * 3600)} (per-GPU MTBF "
                     f"{amount(est.job_mtbf_hours * est.n_gpus)} h), checkpoints every {duration(est.checkpoint_interval_hours * 3600)} "
                     f"and {duration(est.restart_hours * 3600)} restarts: {duration(est.expected_hours * 3600)}, "
                     f"~{human(est.expected_failures)} failures, {duration(est.lost_hours * 3600)} lost, "
                     f"goodput {est.goodput:.0%}")
    else:
        lines.append(f"the job fails every {duration(est.job_mtbf_hours * 3600)}: more often than a checkpoint interval "
                     f"plus a restart, so it never finishes; checkpoint more often")
    if est.optimal_interval_hours:
        lines.append(f"Young/Daly checkpoint interval for this failure rate: {duration(est.optimal_interval_hours * 3600)}")
    return lines


def usd_per_million_tokens(point: ScalePoint, usd_per_gpu_hour: float | None) -> float | None:
    if usd_per_gpu_hour is None or not point.best:
        return None
    return point.n_gpus * usd_per_gpu_hour / 3600 / point.tokens_per_s * 1e6


def scale_table(points: list[ScalePoint], usd_per_gpu_hour: float | None = None):
    """Both sweeps; with a price, the cost per million tokens (lowest where per-GPU throughput peaks)."""
    from rich.table import Table

    table = Table(title="scaling: best layout per GPU count", title_justify="left")
    cols = ["GPUs", "batch", "best layout", "tokens/s", "per GPU", "efficiency", "MFU"]
    cols += ["$/M tokens"] if usd_per_gpu_hour is not None else []
    for col in cols + ["note"]:
        table.add_column(col, justify="left" if col in ("best layout", "note") else "right", no_wrap=col != "note")
    for mode in ("fixed-global-batch", "fixed-per-gpu-batch"):
        pts = [p for p in points if p.mode == mode]
        eff = efficiency(pts)
        dim, wall = knee(pts)
        table.add_section()
        table.add_row(f"[bold]{mode}[/]", *[""] * len(cols))
        for p in pts:
            note = p.why_none
            if p.n_gpus == dim:
                note = "per-GPU efficiency below 80% of the best"
            if p.n_gpus == wall:
                note = "the wall: no faster than with fewer GPUs"
            price = usd_per_million_tokens(p, usd_per_gpu_hour)
            extra = [f"{price:.3g}" if price is not None else "-"] if usd_per_gpu_hour is not None else []
            if p.best:
                table.add_row(str(p.n_gpus), str(p.global_batch), p.best.layout.short(), human(p.tokens_per_s),
                              human(p.per_gpu), f"{eff[p.n_gpus]:.0%}", f"{p.best.mfu:.1%}", *extra, note)
            else:
                table.add_row(str(p.n_gpus), str(p.global_batch), "-", "-", "-", "-", "-", *extra, note)
    return table


# --- JSON ---


def model_dict(workload: Workload, name: str) -> dict:
    counts = param_counts(workload.model)
    cfg = {k: v for k, v in dataclasses.asdict(workload.model).items() if k != "note"}
    return {"name": name, "params_total": counts.total, "params_active": counts.active, "config": cfg,
            "note": workload.model.note or None}


def plan_dict(plan: Plan, budget=None) -> dict:
    """One plan of the --json contract; with a budget (plan -> (TrainingEstimate, Energy or None)),
    `days` and `usd`: the wall-clock and cost with no failures (tokens / tokens_per_s), and beside
    them the expected ones with failures, restarts and checkpoint writes (cost.py), and the run's
    energy and CO2 (energy.py)."""
    out = plan.as_dict()
    if budget is None:
        return out  # (a plan that does not fit still gets them: callers read them for pinned layouts)
    est, used = budget(plan)
    full = est.as_dict()
    out.update(days=est.ideal_days, usd=est.ideal_cost, expected_days=full["expected_days"],
               expected_usd=full["expected_cost_usd"], usd_per_gpu_hour=est.usd_per_gpu_hour)
    if used is not None:
        out.update(energy_kwh=used.kwh, energy_hours=used.hours, pue=used.pue, gpu_power_watts=used.gpu_power_watts,
                   co2_kg=used.co2_kg, grid_gco2_per_kwh=used.grams_per_kwh)
    return out


def energy_lines(used, window=None) -> list[str]:
    if used is None:
        return []
    where = f" in {used.region}" if used.region else (" over the chosen window" if window else "")
    co2 = ""
    if used.co2_kg is not None:
        mass = f"{amount(used.co2_kg / 1000, 1)} t" if used.co2_kg >= 1000 else f"{used.co2_kg:,.0f} kg"
        co2 = f", {mass} CO2 at {used.grams_per_kwh:.0f} g/kWh{where}"
    kwh = f"{human(used.kwh / 1000)} MWh" if used.kwh >= 1e9 else f"{used.kwh / 1000:,.1f} MWh" if used.kwh >= 1000 \
        else f"{used.kwh:,.0f} kWh"
    lines = [f"energy: {kwh} ({used.gpu_power_watts:.0f} W per GPU x {duration(used.hours * 3600)} "
             f"x PUE {used.pue:g}){co2}"]
    if window is not None:
        lines.append(f"carbon-aware start: hour {window.start_index} ({window.start_label}) of the trace: "
                     f"{window.grams_per_kwh:.0f} g/kWh over the run vs {window.now_grams_per_kwh:.0f} starting at once "
                     f"({window.saving:.0%} less CO2)")
    return lines


def plan_json(workload: Workload, cluster: Cluster, model_name: str, *, result: SearchResult | None = None,
              single: Plan | None = None, top: int = 10, training: TrainingEstimate | None = None,
              scale: list[ScalePoint] | None = None, usd_per_gpu_hour: float | None = None, budget=None,
              carbon_window=None) -> dict:
    """The `shoal plan --json` document: `plans`, best first (the contract, docs/planner.md), then
    what was planned and how the search went."""
    plans = result.plans[:top] if result else ([single] if single else [])
    out = {
        "plans": [plan_dict(p, budget) for p in plans],
        "model": model_dict(workload, model_name),
        "workload": {"seq_len": workload.seq_len, "global_batch": workload.global_batch,
                     "tokens_per_step": workload.tokens_per_step, "precision": workload.precision,
                     # what the software stack is assumed to do (Workload's fields, `shoal plan --help`)
                     **{name: getattr(workload, name) for name in WORKLOAD_SETTINGS}},
        "cluster": {"gpu": dataclasses.asdict(cluster.gpu), "n_gpus": cluster.n_gpus,
                    "gpus_per_node": cluster.gpus_per_node, "n_nodes": cluster.n_nodes},
        "closest_misses": [plan_dict(p) for p in (result.closest_misses if result else [])],
        "search": None if result is None else {
            "evaluated": result.evaluated, "fitting": result.fitting, "dominated": result.dominated,
            "note": result.note or None,
            "rejected": dict(result.rejected),
            "seconds": result.seconds},
        "training": training.as_dict() if training else None,
    }
    if carbon_window is not None:
        w = carbon_window
        out["carbon_window"] = {"start_index": w.start_index, "start_label": w.start_label, "hours": w.hours,
                                "gco2_per_kwh": w.grams_per_kwh, "gco2_per_kwh_starting_now": w.now_grams_per_kwh,
                                "saving": w.saving}
    if scale is not None:
        rows = []
        for mode in ("fixed-global-batch", "fixed-per-gpu-batch"):
            pts = [p for p in scale if p.mode == mode]
            eff = efficiency(pts)
            for p in pts:
                rows.append({"n_gpus": p.n_gpus, "mode": mode, "global_batch": p.global_batch,
                             "tokens_per_s": p.tokens_per_s if p.best else None,
                             "per_gpu_efficiency": eff[p.n_gpus] if p.best else None,
                             "mfu": p.best.mfu if p.best else None,
                             "usd_per_million_tokens": usd_per_million_tokens(p, usd_per_gpu_hour),
                             "best": plan_dict(p.best) if p.best else None, "why_none": p.why_none or None})
            dim, wall = knee(pts)
            out.setdefault("scale_knee", {})[mode] = {"efficiency_below_80pct_at": dim, "throughput_stalls_at": wall}
        out["scale"] = rows
    return out
