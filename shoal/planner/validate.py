"""Predicted vs measured: the planner's numbers for a finished `shoal train` run, beside what it logged.

The run's config comes from its newest checkpoint (train_state.json keeps the config and the world
size) or from the recipe it was started with; the measurement from its metrics.jsonl: the median step
time without the warm-up steps (the summary leaves out the same ones), the peak memory rank 0 logged, the
MFU it logged. The prediction is the planner's for that very layout, precision and rank count on the
named hardware (`--gpu local` for a CPU run: this machine, measured). Torch-free, like the planner.
"""

from __future__ import annotations

import dataclasses

import json
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import UserError

WARMUP_STEPS = 2
"""Steps left out of the measured mean: the trainer's summary leaves out the same first two
(shoal/train/metrics.py WARMUP_STEPS; that module imports torch, so the number is repeated here)."""


@dataclass(frozen=True)
class Comparison:
    run_dir: str
    layout: str
    world: int
    steps_measured: int
    predicted_step_s: float
    measured_step_s: float
    predicted_peak_gib: float
    measured_peak_gib: float
    measured_mfu: float | None
    """MFU as the run logged it, against the peak the trainer uses (datasheet GPU or CPU peak)."""

    @property
    def predicted_mfu(self) -> float | None:
        """The predicted step's MFU against the run's own peak, so the two MFUs compare (the planner's
        `local` peak is a measured matmul rate, not the datasheet peak the trainer divides by)."""
        return None if self.measured_mfu is None else self.measured_mfu * self.measured_step_s / self.predicted_step_s

    @property
    def step_ratio(self) -> float:
        """Predicted / measured step time (1.0 = exact; above 1: the planner is pessimistic)."""
        return self.predicted_step_s / self.measured_step_s

    @property
    def memory_ratio(self) -> float:
        return self.predicted_peak_gib / self.measured_peak_gib if self.measured_peak_gib else float("nan")

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {**asdict(self), "predicted_mfu": self.predicted_mfu, "step_ratio": self.step_ratio,
                "memory_ratio": self.memory_ratio}


def _newest_train_state(run_dir: Path) -> dict | None:
    states = []
    for path in run_dir.rglob("train_state.json"):
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        states.append((int(state.get("step", 0)), state))
    return max(states, key=lambda s: s[0])[1] if states else None


def run_config(run_dir: Path, recipe: str | None, overrides: list[str], gpus: int | None):
    """(JobConfig, world size) of the run."""
    from shoal.config import JobConfig, _set, load_config

    if recipe is not None:
        if gpus is None:
            raise UserError("gpus", None, "with --recipe, give the run's rank count with --gpus N")
        return load_config(recipe, overrides), gpus
    state = _newest_train_state(run_dir)
    if state is None or "config" not in state:
        raise UserError("validate", str(run_dir), "holds no checkpoint with the run's config; pass the recipe it "
                                                  "ran: --validate DIR --recipe RECIPE.toml [--set ...] --gpus N")
    cfg = JobConfig()
    for section, values in state["config"].items():
        for key, value in values.items():
            if value is not None:
                _set(cfg, f"{section}.{key}", value)
    for item in overrides:
        dotted, _, value = item.partition("=")
        _set(cfg, dotted.strip(), value)
    world = gpus or int(state.get("layout", {}).get("world_size", 0)) or None
    if world is None:
        raise UserError("gpus", None, "the checkpoint does not say how many ranks ran; give --gpus N")
    return cfg.validate(), world


def measured(run_dir: Path) -> tuple[int, float, float, float | None]:
    """(steady steps, median step seconds, peak bytes, mean MFU) from <run_dir>/metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError("validate", str(run_dir), "has no metrics.jsonl (is it a `shoal train --out` directory?)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise UserError("validate", str(path), f"line {i} is not JSON") from None
    if not rows:
        raise UserError("validate", str(path), "is empty: the run logged no step")
    steady = rows[WARMUP_STEPS:] if len(rows) > WARMUP_STEPS else rows
    # The median, not the summary's mean: the plan is for an undisturbed step, and on a shared machine
    # a few steps stretched by other jobs would otherwise decide the comparison.
    times = sorted(r["step_time_s"] for r in steady)
    step = (times[(len(times) - 1) // 2] + times[len(times) // 2]) / 2
    peak = max(float(r.get("peak_mem_bytes", 0)) for r in rows)
    mfus = [r["mfu"] for r in steady if "mfu" in r]
    return len(steady), step, peak, (sum(mfus) / len(mfus) if mfus else None)


def compare(run_dir: str | Path, gpu, *, recipe: str | None = None, overrides: list[str] = (),
            gpus: int | None = None, gpus_per_node: int | None = None) -> Comparison:
    from shoal.job import resolve
    from shoal.planner.evaluate import evaluate
    from shoal.planner.hardware import GiB
    from shoal.planner.layout import Cluster, Workload
    from shoal.planner.slow_links import slow_link_fields

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError("validate", str(run_dir), "no such directory")
    n, step, peak, mfu = measured(run_dir)
    cfg, world = run_config(run_dir, recipe, list(overrides), gpus)
    from shoal.planner.hardware import local_for_ranks

    gpu = local_for_ranks(gpu, world)
    job = resolve(cfg, world)
    t = cfg.train
    workload = Workload(job.model, t.seq_len, t.global_batch, precision=t.precision, attention="flash",
                        **slow_link_fields(dataclasses.asdict(cfg.parallel)))
    plan = evaluate(workload, job.layout, Cluster(gpu, world, gpus_per_node or gpu.gpus_per_node), check=False)
    return Comparison(str(run_dir), job.layout.short(), world, n, plan.time.step, step, plan.memory.total / GiB,
                      peak / GiB, mfu)
