"""Predicted vs measured: the planner's numbers for a finished `shoal train` run, beside what it logged.

The prediction is the one the run stored before its first step (run.json's `prediction`, written by
the trainer with shoal/planner/prediction.py for the run's own layout on its own hardware). A run
from before shoal stored predictions, or a question about other hardware (`--gpu`, `--hw-file`,
`--hw`), is planned here instead, from the run's config: run.json's, else its newest checkpoint's
(train_state.json), else the recipe it was started with; the comparison says which. The
measurement comes from its metrics.jsonl: rundir.metrics.steady (the medians the run summary and
`shoal report` show too) and the peak memory rank 0 logged. Torch-free, like the planner.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from shoal.config import config_from_sections, load_config
from shoal.errors import UserError
from shoal.hardware.gpu import GiB
from shoal.job import resolve
from shoal.planner.prediction import RunPrediction, from_run_info, plan_job
from shoal.rundir.metrics import read_rows, steady
from shoal.rundir.names import METRICS
from shoal.rundir.run_info import read_info, starts


@dataclass(frozen=True)
class Comparison:
    run_dir: str
    hardware: str
    """The planner's hardware entry the prediction is for."""
    source: str
    """Where the prediction comes from: stored by the run, or planned now (and why)."""
    layout: str
    world: int
    steps_measured: int
    predicted_step_s: float
    measured_step_s: float
    predicted_peak_gib: float
    measured_peak_gib: float
    measured_mfu: float | None
    """MFU as the run logged it, against the peak the trainer uses (datasheet GPU or CPU peak)."""
    predicted_mfu: float | None = None
    """The predicted step's MFU against the run's own peak, so the two MFUs compare (the planner's
    `local` peak is a measured matmul rate, not the datasheet peak the trainer divides by)."""

    @property
    def step_ratio(self) -> float:
        """Predicted / measured step time (1.0 = exact; above 1: the planner is pessimistic)."""
        return self.predicted_step_s / self.measured_step_s

    @property
    def memory_ratio(self) -> float:
        return self.predicted_peak_gib / self.measured_peak_gib if self.measured_peak_gib else float("nan")

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return {**asdict(self), "step_ratio": self.step_ratio, "memory_ratio": self.memory_ratio}


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
    if recipe is not None:
        if gpus is None:
            raise UserError("gpus", None, "with --recipe, give the run's rank count with --gpus N")
        return load_config(recipe, overrides), gpus
    state = _newest_train_state(run_dir)
    if state is None or "config" not in state:
        raise UserError("validate", str(run_dir), "holds no checkpoint with the run's config; pass the recipe it "
                                                  "ran: --validate DIR --recipe RECIPE.toml [--set ...] --gpus N")
    cfg = config_from_sections(state["config"], overrides)
    world = gpus or int(state.get("layout", {}).get("world_size", 0)) or None
    if world is None:
        raise UserError("gpus", None, "the checkpoint does not say how many ranks ran; give --gpus N")
    return cfg, world


def measured(run_dir: Path, info: dict | None) -> tuple[int, float, float, float | None]:
    """(steady steps, median step seconds, peak bytes, median MFU) from <run_dir>/metrics.jsonl."""
    if not (run_dir / METRICS).is_file():
        raise UserError("validate", str(run_dir), f"has no {METRICS} (is it a `shoal train --out` directory?)")
    rows = read_rows(run_dir, need=("step_time_s",))  # kinds checked there; a torn last line left out
    if not rows:
        raise UserError("validate", str(run_dir / METRICS), "is empty: the run logged no step")
    speed = steady(rows, starts(info))
    if not speed.step_time_s > 0:  # a step takes time: the ratios below divide by it
        raise UserError("validate", str(run_dir / METRICS), f"has a median step_time_s of {speed.step_time_s}; "
                                                            "`shoal train` never writes that: give a run's --out "
                                                            "directory, or re-run it")
    peak = max(float(r.get("peak_mem_bytes", 0)) for r in rows)
    return speed.steps, speed.step_time_s, peak, speed.mfu


def compare(run_dir: str | Path, gpu=None, *, recipe: str | None = None, overrides: list[str] = (),
            gpus: int | None = None, gpus_per_node: int | None = None) -> Comparison:
    """The run's stored prediction against its measurement; with `gpu` (or for a run that stored
    none) the plan is made now for that hardware (default: this machine, `local`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError("validate", str(run_dir), "no such directory")
    info = read_info(run_dir, need=("layout", "world"))
    n, step, peak, mfu = measured(run_dir, info)
    info = info or {}
    if gpus is not None and info.get("world") and gpus != int(info["world"]):  # a plan for ranks not measured
        raise UserError("gpus", gpus, f"the run had {info['world']} ranks (its run.json); --gpus gives that count "
                                      "where a run did not store it: leave it out, or plan anew without --validate")
    # Any of these asks for another plan than the one stored (--gpus-per-node too: it was ignored)
    asked = gpu is not None or recipe is not None or overrides or gpus_per_node is not None
    stored = None if asked else from_run_info(info)
    if stored is not None and stored.step_time_s is not None:
        from shoal.layout import Layout

        return _comparison(run_dir, stored, "stored by the run (run.json)", Layout(**info["layout"]).short(),
                           int(info["world"]), n, step, peak, mfu)
    why = ("planned now: run.json holds no step-time prediction (a run from before shoal stored them)"
           if not asked else "planned now for the hardware or settings asked for")
    job, per_node = _run_job(run_dir, info, recipe, list(overrides), gpus)
    from shoal.hardware.local import local_for_ranks
    from shoal.hardware.lookup import get_gpu

    per_node = gpus_per_node or per_node or job.world
    plan = plan_job(job, local_for_ranks(gpu or get_gpu("local"), per_node), per_node)
    return _comparison(run_dir, plan, why, job.layout.short(), job.world, n, step, peak, mfu)


def _comparison(run_dir: Path, pred: RunPrediction, source: str, layout: str, world: int, n: int, step: float,
                peak: float, mfu: float | None) -> Comparison:
    return Comparison(str(run_dir), pred.hardware, source, layout, world, n, pred.step_time_s, step,
                      pred.memory.total / GiB, peak / GiB, mfu, pred.on_measured_peak(step, mfu))


def _run_job(run_dir: Path, info: dict, recipe: str | None, overrides: list[str], gpus: int | None):
    """(the run's resolved Job, ranks per node or 0): from --recipe, else run.json, else a checkpoint."""
    if recipe is None and info.get("config") and info.get("world"):
        return resolve(config_from_sections(info["config"], overrides), gpus or int(info["world"])), int(info.get("local_world", 0))
    cfg, world = run_config(run_dir, recipe, overrides, gpus)
    return resolve(cfg, world), 0
