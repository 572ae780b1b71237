"""<out>/run.json: what a run was asked to do, written by rank 0 when (re)starting.

metrics.jsonl says what happened each step; this says with which config, layout and machines, and
when each attempt started (a restart adds an entry), so a report can draw the rank grid, the
pipeline schedule and the planner's prediction for the run's own layout after the fact.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from shoal.errors import UserError
from shoal.files import write_json
from shoal.layout import Layout
from shoal.rundir.kinds import check_fields, damaged
from shoal.rundir.names import RUN_INFO

PREDICTION_KEY = "prediction"
INFO_KINDS = {  # write_run_info's record; `prediction` has its own lenient reader (shoal/planner/prediction.py)
    "shoal_run": int, "model": dict, "layout": Layout, "world": int, "local_world": int, "device": str,
    "device_name": str, "starts": [{"step": int, "time": float, "world": int}],
    "config": {str: dict, "train": {"steps": int, "global_batch": int, "seq_len": int},
               "checkpoint": {"every": int, "dir": str}, "model": {"preset": (str, None)}}}


def write_run_info(job, out: Path, start_step: int, *, local_world: int, device: str, device_name: str,
                   prediction=None) -> None:
    """Write (fresh run) or extend (resumed run: one more `starts` entry) <out>/run.json, with the
    planner's prediction for this run when there is one (an object with as_dict())."""
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
    # each attempt's ranks: a resume may change the world, and the rows it logged name its ranks
    starts.append({"step": start_step, "time": time.time(), "world": job.world})
    info = {
        "shoal_run": 1,
        "config": job.cfg.to_dict(),
        "model": dataclasses.asdict(job.model),
        "layout": dataclasses.asdict(job.layout),
        "world": job.world,
        "local_world": local_world,  # ranks per node
        "device": device,
        "device_name": device_name,
        "starts": starts,
    }
    if prediction is not None:
        info[PREDICTION_KEY] = prediction.as_dict()
    write_json(path, info, durable=False, default=str)  # a report reading it mid-write sees the old or the new record


def read_json(path: Path, where: str) -> dict:
    """A JSON object from `path` (run.json), or a UserError: not UTF-8, not JSON, nested past
    Python's recursion limit, or not an object."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise UserError("run_dir", where, f"has an unreadable {path.name} ({type(e).__name__}); "
                                          "it is not a shoal run, or the file was damaged") from None
    if not isinstance(info, dict):
        raise UserError("run_dir", where, f"has a {path.name} that shoal did not write (not a JSON object); "
                                          "give the --out directory of a `shoal train` run")
    return info


def read_info(run_dir: Path, need: tuple[str, ...] = ()) -> dict | None:
    """<run_dir>/run.json as `shoal train` writes it (None where there is none), or a UserError: its
    fields' kinds, the dotted paths in `need` present, and its grid one that train accepted."""
    path, where = run_dir / RUN_INFO, str(run_dir)
    if not path.is_file():
        return None
    info = read_json(path, where)
    if info.get("shoal_run") != 1:
        raise UserError("run_dir", where, f"has a {RUN_INFO} that shoal did not write; give the --out "
                                          "directory of a `shoal train` run")
    check_fields(info, INFO_KINDS, RUN_INFO, where, need)
    if "layout" in info and "world" in info:
        _check_grid(info, where)
    return info


def _check_grid(info: dict, where: str) -> None:
    """run.json's model, layout and ranks as `shoal train` accepted them before it started: the
    report draws the grid and simulates the schedule from them, so edited sizes (a world of 1e12,
    a million virtual stages) must stop here, not hang a drawing. The same rules train applies
    (model.validate, layout_rules.problems); the trainer's own limits of the day (TrainerLimit) are left
    out, so runs from another shoal version still report."""
    from shoal.layout import TrainerLimit
    from shoal.layout_rules import problems
    from shoal.model.config import ModelConfig

    try:
        model = ModelConfig(**info.get("model", {})).validate()
        lay = Layout(**info["layout"])
        train = info.get("config", {}).get("train", {})
        found = [e for e in problems(lay, model, info["world"], train.get("global_batch", lay.dp * lay.micro_batch),
                                     train.get("seq_len", model.max_seq_len)) if not isinstance(e, TrainerLimit)]
    except (TypeError, UserError) as e:  # TypeError: a model field ModelConfig does not have
        raise damaged(where, f"{RUN_INFO} model", info.get("model"), f"a model shoal train accepts ({e})") from None
    if found:
        raise damaged(where, f"{RUN_INFO} layout", info["layout"], f"a layout shoal train accepts ({found[0]})")
    if not 1 <= info.get("local_world", 1) <= info["world"]:
        raise damaged(where, f"{RUN_INFO} local_world", info["local_world"], f"ranks per node, 1 to world ({info['world']})")


def starts(info: dict | None) -> tuple[int, ...]:
    """The steps each attempt of the run started from (run.json's `starts`; (0,) without one)."""
    found = tuple(s["step"] for s in (info or {}).get("starts", []) if "step" in s)
    return found or (0,)
