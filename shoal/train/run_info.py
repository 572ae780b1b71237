"""<out>/run.json: what a run was asked to do, written by rank 0 when (re)starting, for `shoal report`.

metrics.jsonl says what happened each step; this says with which config, layout and machines, and
when each attempt started (a restart adds an entry), so a report can draw the rank grid, the
pipeline schedule and the planner's prediction for the run's own layout after the fact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

RUN_INFO = "run.json"
PREDICTION_KEY = "prediction"


def write_run_info(job, rt, out: Path, start_step: int, prediction=None) -> None:
    """Rank 0 writes (fresh run) or extends (resumed run: one more `starts` entry) <out>/run.json,
    with the planner's prediction for this run (shoal/train/prediction.py) when there is one."""
    if not rt.is_main:
        return
    path = out / RUN_INFO
    starts = []
    if start_step > 0 and path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = None
        starts = old.get("starts") if isinstance(old, dict) else None
        if not isinstance(starts, list):
            starts = []  # a damaged record loses the earlier starts, not the run
    starts.append({"step": start_step, "time": time.time()})
    info = {
        "shoal_run": 1,
        "config": job.cfg.to_dict(),
        "model": dataclasses.asdict(job.model),
        "layout": dataclasses.asdict(job.layout),
        "world": job.world,
        # ranks per node: the launcher's LOCAL_WORLD_SIZE (torchrun and shoal's own launcher set it)
        "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", job.world)),
        "device": rt.device.type,
        "device_name": device_name(rt.device),
        "starts": starts,
    }
    if prediction is not None:
        info[PREDICTION_KEY] = prediction.as_dict()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=1, default=str))
    os.replace(tmp, path)  # a report reading it mid-write sees the old or the new record, never half


def device_name(device) -> str:
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return "cpu"
