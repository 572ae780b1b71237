"""The planner's prediction for a finished run's own layout, beside what the run measured.

Memory always (the planner's memory model needs only the device's capacity); step time and MFU
where the planner knows the hardware: a catalog GPU by its CUDA name, or this machine's `local`
profile once `shoal plan --gpu local` has measured it (a report never starts a benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shoal.layout import Layout
from shoal.model.config import ModelConfig


@dataclass
class Prediction:
    memory: object
    """shoal.planner.memory.MemoryBreakdown of the busiest rank."""
    plan: object | None
    """shoal.planner.evaluate.Plan (None: hardware unknown to the planner)."""
    hardware: str
    why_no_time: str = ""


def predict(info: dict) -> Prediction:
    from shoal.planner import hardware
    from shoal.planner.evaluate import evaluate
    from shoal.planner.layout import Cluster, Workload
    from shoal.planner.memory import memory
    from shoal.planner.slow_links import slow_link_fields

    model = ModelConfig(**info["model"])
    layout = Layout(**info["layout"])
    t = info["config"]["train"]
    workload = Workload(model, t["seq_len"], t["global_batch"], precision=t["precision"], attention="flash",
                        **slow_link_fields(info["config"].get("parallel", {})))
    gpu, why = None, ""
    if info.get("device") == "cuda":
        gpu = hardware.lookup_gpu(info.get("device_name", ""))
        why = "" if gpu else f"the planner's catalog does not know {info.get('device_name')!r}"
    elif hardware.local_profile_path().exists():
        gpu = hardware.local_gpu()
    else:
        why = "this machine is not measured yet: run `shoal plan --gpu local ...` once, then report again"
    per_node = max(1, info.get("local_world", info["world"]))
    if gpu is None:
        from shoal.planner.hardware import CATALOG
        from shoal.train.memory_check import CPU_RESERVED_BYTES

        # memory needs only capacity and reserved bytes; the entry's rates are not read
        gpu = replace(next(iter(CATALOG.values())), name=info.get("device", "cpu"), hbm_bytes=float("inf"),
                      reserved_bytes=CPU_RESERVED_BYTES)
        mem = memory(workload, layout, Cluster(gpu, info["world"], per_node))
        return Prediction(mem, None, info.get("device", "cpu"), why)
    plan = evaluate(workload, layout, Cluster(gpu, info["world"], per_node))
    return Prediction(plan.memory, plan, gpu.name)
