"""The plan of this run: the planner's prediction for a job's own layout on its own hardware.

Rank 0 computes it once, before step 1 (shoal/train/trainer.py), and it travels with the
measurement: in run.json (`prediction`), beside every metrics.jsonl row (`predicted_*` keys) and in
the end-of-run summary with its ratios. `shoal plan --validate RUN_DIR` and `shoal report` read
the stored one back (`from_run_info`) instead of planning again.

The hardware is the planner's entry for the device the run is on: the catalog GPU for a CUDA
device it knows, or this machine's measured `local` profile on a CPU (measured once, then cached;
shoal.planner.local_hardware.local_gpu). An unknown GPU still gets the memory prediction, and says why
the step time has none. Torch-free, like the planner: the trainer passes the device as strings.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace

from shoal.errors import UserError
from shoal.planner.memory import MemoryBreakdown


@dataclass(frozen=True)
class RunPrediction:
    hardware: str
    """The planner's entry it was computed for ('local', 'h100-sxm', ...), or the device's name when
    the planner does not know it (then only memory is predicted)."""
    memory: MemoryBreakdown
    """The busiest rank's peak, by part."""
    step_time_s: float | None = None
    time_breakdown_s: dict = field(default_factory=dict)
    why_no_time: str = ""
    mfu: float | None = None
    """Model FLOPs per step / (predicted step time x the run's own MFU peak): the same denominator
    as the measured MFU in metrics.jsonl, so the two compare (the planner's `local` peak is a
    measured matmul rate, the trainer's a datasheet peak)."""

    def with_mfu(self, model_flops_per_step: float, peak_flops: float) -> "RunPrediction":
        if self.step_time_s is None:
            return self
        return replace(self, mfu=model_flops_per_step / self.step_time_s / peak_flops)

    def metrics_fields(self) -> dict:
        """The keys beside each metrics.jsonl row (constant over the run; a reader needs no run.json)."""
        out = {"predicted_peak_mem_bytes": self.memory.total}
        if self.step_time_s is not None:
            out.update(predicted_step_time_s=self.step_time_s, predicted_mfu=self.mfu)
        return out

    def summary_rows(self, step_time_s: float, mfu: float, peak_bytes: float) -> dict:
        """The end-of-run summary's rows: each prediction, then predicted / measured for all three."""
        rows, ratios = {}, []
        if self.step_time_s is not None:
            rows[f"predicted step time (s, planner on {self.hardware})"] = self.step_time_s
            rows["predicted MFU (same peak)"] = self.mfu
            ratios += [f"step time {self.step_time_s / step_time_s:.2f}", f"MFU {self.mfu / mfu:.2f}"]
        else:
            rows["predicted step time"] = f"none: {self.why_no_time}"
        rows["predicted peak memory (GiB, planner)"] = self.memory.total / 2**30
        ratios.append(f"peak memory {self.memory.total / peak_bytes:.2f}" if peak_bytes else "peak memory -")
        rows["predicted / measured"] = ", ".join(ratios)
        return rows

    def as_dict(self) -> dict:
        return {"hardware": self.hardware, "step_time_s": self.step_time_s, "time_breakdown_s": self.time_breakdown_s,
                "mfu": self.mfu, "peak_memory_bytes": self.memory.total, "memory": asdict(self.memory),
                "why_no_time": self.why_no_time}

    @classmethod
    def from_dict(cls, d: dict) -> "RunPrediction":
        return cls(hardware=d["hardware"], memory=MemoryBreakdown(**d["memory"]), step_time_s=d.get("step_time_s"),
                   time_breakdown_s=d.get("time_breakdown_s") or {}, why_no_time=d.get("why_no_time", ""),
                   mfu=d.get("mfu"))


def planner_hardware(device_kind: str, device_name: str, ranks_per_node: int, *, measure: bool):
    """(the planner's GPU entry for this device as `ranks_per_node` ranks see it, '') or (None, why not)."""
    from shoal.planner import hardware, local_hardware

    if device_kind == "cuda":
        gpu = hardware.lookup_gpu(device_name)
        return (gpu, "") if gpu else (None, f"the planner's catalog does not know {device_name!r}")
    if not measure and not local_hardware.local_profile_path().exists():
        return None, "this machine is not measured yet: run `shoal plan --gpu local ...` once"
    try:
        gpu = local_hardware.local_gpu()  # measures (a few seconds, once per machine) when nothing is cached
    except UserError as e:
        return None, str(e)
    except (OSError, ValueError, KeyError) as e:  # a damaged cache must not stop a run: it loses its prediction
        return None, f"{local_hardware.local_profile_path()} is unreadable ({type(e).__name__}); `shoal plan --gpu local --remeasure`"
    return local_hardware.local_for_ranks(gpu, ranks_per_node), ""


def predict_job(job, device_kind: str, device_name: str, local_world: int, *, measure: bool = True) -> RunPrediction:
    """The plan of one run: the job's layout on job.world ranks, `local_world` of them per node."""
    from shoal.planner.hardware import GPU
    from shoal.planner.local_hardware import LOCAL_PROCESS_BYTES
    from shoal.train.memory_check import Device, predict_peak

    gpu, why = planner_hardware(device_kind, device_name, min(local_world, job.world), measure=measure)
    if gpu is None:
        # Memory needs only the reserved bytes (capacity is the memory check's business, not the plan's).
        reserved = LOCAL_PROCESS_BYTES if device_kind == "cpu" else GPU.reserved_bytes
        return RunPrediction(device_name or device_kind, predict_peak(job, Device(device_kind, float("inf"), reserved, "")),
                             why_no_time=why)
    return plan_job(job, gpu, local_world)


def plan_job(job, gpu, per_node: int) -> RunPrediction:
    """The planner's memory and step time for the job's layout on `gpu`, `per_node` ranks to a node."""
    from shoal.planner.evaluate import TIME_PARTS, evaluate
    from shoal.planner.layout import Cluster, Workload

    plan = evaluate(Workload.of_job(job), job.layout, Cluster(gpu, job.world, max(1, min(per_node, job.world))), check=False)
    return RunPrediction(gpu.name, plan.memory, plan.time.step, {k: getattr(plan.time, k) for k in TIME_PARTS})


def predict_this_run(job, rt, model_flops_per_step: float, peak_flops: float, *, say=None) -> RunPrediction | None:
    """Rank 0's prediction for the run it is in, before step 1 (other ranks: None). `say` prints the
    one line shown when this machine must be measured first (once; the profile is cached)."""
    from shoal.planner.local_hardware import local_profile_path
    from shoal.train.run_info import device_name

    if not rt.is_main:
        return None
    if rt.device.type == "cpu" and say and not local_profile_path().exists():
        say(f"measuring this machine once for the planner's prediction (a few seconds; cached in {local_profile_path()})")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", job.world))
    pred = predict_job(job, rt.device.type, device_name(rt.device), local_world)
    return pred.with_mfu(model_flops_per_step, peak_flops)


def config_from_sections(sections: dict, overrides: list[str] = ()):
    """A JobConfig from a stored config (run.json's or a checkpoint's `config`), then --set overrides."""
    from shoal.config import JobConfig, _set

    cfg = JobConfig()
    for section, values in sections.items():
        for key, value in values.items():
            if value is not None:
                _set(cfg, f"{section}.{key}", value)
    for item in overrides:
        dotted, _, value = item.partition("=")
        _set(cfg, dotted.strip(), value)
    return cfg.validate()


def replan_run_info(info: dict, *, measure: bool = False) -> RunPrediction:
    """The plan for a run that stored none (run.json from before predictions were stored), made now
    from its config on the hardware it names; never measures this machine unless asked."""
    from shoal.job import resolve

    job = resolve(config_from_sections(info["config"]), int(info["world"]))
    return predict_job(job, info.get("device", "cpu"), info.get("device_name", ""),
                       int(info.get("local_world", info["world"])), measure=measure)


def from_run_info(info: dict) -> RunPrediction | None:
    """The prediction a run stored in its run.json, or None (a run from before predictions were stored)."""
    from shoal.train.run_info import PREDICTION_KEY

    stored = info.get(PREDICTION_KEY)
    if not stored:
        return None
    try:
        return RunPrediction.from_dict(stored)
    except (KeyError, TypeError):
        return None  # a damaged record: the caller recomputes, as for an old run
