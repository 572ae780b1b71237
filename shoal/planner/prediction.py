"""The plan of one run: the planner's prediction for a job's own layout on its own hardware.

The trainer's rank 0 computes it once, before step 1 (shoal/train/trainer.py), and it travels with
the measurement: in run.json (`prediction`), beside every metrics.jsonl row (`predicted_*` keys) and
in the end-of-run summary with its ratios. `shoal plan --validate RUN_DIR` and `shoal report` read
the stored one back (`from_run_info`) instead of planning again.

The hardware is the planner's entry for the device the run is on: the catalog GPU for a CUDA
device it knows, or this machine's measured `local` profile on a CPU (measured once, then cached;
shoal.hardware.local.local_gpu). An unknown GPU still gets the memory prediction, and says why the
step time has none. Torch-free, like the planner: the device comes as strings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from shoal.errors import UserError
from shoal.hardware.memory import Device
from shoal.planner.memory import MemoryBreakdown
from shoal.rundir.run_info import PREDICTION_KEY


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

    def on_measured_peak(self, measured_step_s: float, measured_mfu: float | None) -> float | None:
        """The predicted step's MFU against the peak a measured MFU divides by, which run.json does
        not hold: the measured MFU scaled by measured / predicted step time (MFU x step time is the
        same for both: model FLOPs per step over the peak)."""
        if self.step_time_s is None or not measured_mfu:
            return None
        return measured_mfu * measured_step_s / self.step_time_s

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


def predict_peak(job, device: Device) -> MemoryBreakdown:
    """The planner's MemoryBreakdown of the busiest rank for this job on this device."""
    from shoal.hardware.catalog import CATALOG
    from shoal.planner.memory import memory
    from shoal.planner.workload import Cluster, Workload

    # The memory model reads only the device's capacity and reserved bytes; the rest of the entry
    # (rates, links) is the time model's and does not matter here.
    gpu = replace(next(iter(CATALOG.values())), name=device.kind, hbm_bytes=device.capacity,
                  reserved_bytes=device.reserved)
    return memory(Workload.of_job(job), job.layout, Cluster(gpu, job.world, job.world))


def planner_hardware(device_kind: str, device_name: str, ranks_per_node: int, *, measure: bool):
    """(the planner's GPU entry for this device as `ranks_per_node` ranks see it, '') or (None, why not)."""
    from shoal.hardware import local
    from shoal.hardware.lookup import lookup_gpu

    if device_kind == "cuda":
        gpu = lookup_gpu(device_name)
        return (gpu, "") if gpu else (None, f"the planner's catalog does not know {device_name!r}")
    if not measure and not local.local_profile_path().exists():
        return None, "this machine is not measured yet: run `shoal plan --gpu local ...` once"
    try:
        gpu = local.local_gpu()  # measures (a few seconds, once per machine) when nothing is cached
    except UserError as e:
        return None, str(e)
    except (OSError, ValueError, KeyError) as e:  # a damaged cache must not stop a run: it loses its prediction
        return None, f"{local.local_profile_path()} is unreadable ({type(e).__name__}); `shoal plan --gpu local --remeasure`"
    return local.local_for_ranks(gpu, ranks_per_node), ""


def predict_job(job, device_kind: str, device_name: str, local_world: int, *, measure: bool = True) -> RunPrediction:
    """The plan of one run: the job's layout on job.world ranks, `local_world` of them per node."""
    from shoal.hardware.gpu import GPU
    from shoal.hardware.local import LOCAL_PROCESS_BYTES

    gpu, why = planner_hardware(device_kind, device_name, min(local_world, job.world), measure=measure)
    if gpu is not None and job.cfg.train.precision == "fp8" and not gpu.peak_fp8_flops:
        gpu, why = None, "FP8 is emulated here (no FP8 matrix units), so its step time is not the planner's to predict"
    if gpu is None:
        # Memory needs only the reserved bytes (capacity is the memory check's business, not the plan's).
        reserved = LOCAL_PROCESS_BYTES if device_kind == "cpu" else GPU.reserved_bytes
        return RunPrediction(device_name or device_kind, predict_peak(job, Device(device_kind, float("inf"), reserved, "")),
                             why_no_time=why)
    return plan_job(job, gpu, local_world)


def plan_job(job, gpu, per_node: int) -> RunPrediction:
    """The planner's memory and step time for the job's layout on `gpu`, `per_node` ranks to a node."""
    from shoal.planner.evaluate import TIME_PARTS, evaluate
    from shoal.planner.workload import Cluster, Workload

    plan = evaluate(Workload.of_job(job), job.layout, Cluster(gpu, job.world, max(1, min(per_node, job.world))), check=False)
    return RunPrediction(gpu.name, plan.memory, plan.time.step, {k: getattr(plan.time, k) for k in TIME_PARTS})


def replan_run_info(info: dict, *, measure: bool = False) -> RunPrediction:
    """The plan for a run that stored none (run.json from before predictions were stored), made now
    from its config on the hardware it names; never measures this machine unless asked."""
    from shoal.config import config_from_sections
    from shoal.job import resolve

    job = resolve(config_from_sections(info["config"]), int(info["world"]))
    return predict_job(job, info.get("device", "cpu"), info.get("device_name", ""),
                       int(info.get("local_world", info["world"])), measure=measure)


def from_run_info(info: dict) -> RunPrediction | None:
    """The prediction a run stored in its run.json, or None (a run from before predictions were stored)."""
    stored = info.get(PREDICTION_KEY)
    if not stored:
        return None
    try:
        return RunPrediction.from_dict(stored)
    except (KeyError, TypeError):
        return None  # a damaged record: the caller recomputes, as for an old run
