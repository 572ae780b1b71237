"""Reading a run directory for `shoal report`: metrics.jsonl, run.json and the checkpoints.

A directory that is not a run (missing, empty, someone else's files), a damaged one (a field of
another type than the trainer writes, see ROW_KINDS and INFO_KINDS) or a run that stopped before
its last step (killed) is a UserError with one line saying which, so the CLI exits 2. The kinds are
checked here, where the files are read, so no reader (`shoal report`, `shoal plan --validate`) meets
a string where it does arithmetic. A run still being written (its metrics file changed recently)
is read as far as it goes.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from shoal.errors import UserError
from shoal.layout import Layout

METRICS = "metrics.jsonl"
RUN_INFO = "run.json"  # written by shoal/train/run_info.py
REQUIRED = ("step", "loss", "step_time_s")

# What shoal/train writes, as kinds: int, float (any JSON number: NaN is how a diverged loss is
# logged), str, dict, None (null), a tuple (any of), [kind] (a list of it), {name: kind} (those
# fields, each optional: old runs lack the newer ones; `str` for any other key), a dataclass (a dict
# of its fields only, typed like their defaults).
ROW_KINDS = {  # shoal/train/trainer.py's row (`replicas` and wire fields are read by nobody here)
    "step": int, "loss": float, "eval_loss": float, "lr": float, "grad_norm": float, "tokens": int,
    "tokens_per_s": float, "step_time_s": float, "mfu": float, "peak_mem_bytes": float, "model_state_bytes": float,
    "comm_bytes": {str: float}, "comm_bytes_by_dtype": {str: float}, "comm_bytes_by_dim": {str: float},
    "memory_by_rank": {str: [(float, None)]},  # None: not measured on that rank
    "compute_time_spread": float, "slowest_rank": int, "stragglers": [int],
    "predicted_peak_mem_bytes": float, "predicted_step_time_s": float, "predicted_mfu": float}
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "peak")
"""memory_by_rank's lists (shoal/train/memory.py), one number per rank each."""
INFO_KINDS = {  # shoal/train/run_info.py's record; `prediction` has its own lenient reader (prediction.py)
    "shoal_run": int, "model": dict, "layout": Layout, "world": int, "local_world": int, "device": str,
    "device_name": str, "starts": [{"step": int, "time": float}],
    "config": {str: dict, "train": {"steps": int, "global_batch": int, "seq_len": int},
               "checkpoint": {"every": int, "dir": str}, "model": {"preset": (str, None)}}}
LOAD_NEEDS = ("config.train.steps", "config.checkpoint")
"""The run.json fields load_run reads (a report needs more: shoal/report/run_report.py)."""

STALE_AFTER_S = 120.0
"""A run whose metrics file has not changed for max(this, 20 step times) is no longer running."""


@dataclass
class Run:
    path: Path
    rows: list[dict]
    info: dict | None
    """run.json (None for runs from before it existed: no rank grid, schedule or prediction)."""
    checkpoints: list[int] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)
    """Steps a later attempt started from (resumed after a failure or a stop)."""
    in_progress: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def total_steps(self) -> int | None:
        return self.info["config"]["train"]["steps"] if self.info else None

    @property
    def last_step(self) -> int:
        return self.rows[-1]["step"] if self.rows else 0


def load_run(path: Path, allow_partial: bool = False, now: float | None = None, need: tuple[str, ...] = ()) -> Run:
    """The run at `path`, or a UserError naming what is wrong with it; `need`: the run.json fields
    the caller reads, beyond LOAD_NEEDS (dotted paths)."""
    where = str(path)
    if not path.exists():
        raise UserError("run_dir", where, "does not exist; give the --out directory of a `shoal train` run")
    if not path.is_dir():
        raise UserError("run_dir", where, "is a file; give the --out directory of a `shoal train` run")
    entries = list(path.iterdir())
    if not entries:
        raise UserError("run_dir", where, "is empty: no run has written here yet (metrics.jsonl appears at step 1)")
    metrics, info_path = path / METRICS, path / RUN_INFO
    if not metrics.is_file() and not info_path.is_file():
        names = ", ".join(sorted(e.name for e in entries)[:4])
        raise UserError("run_dir", where, f"is not a shoal run (no {METRICS} or {RUN_INFO}; it holds {names}); "
                                          "give the --out directory of a `shoal train` run")
    info = read_info(info_path, where, LOAD_NEEDS + need) if info_path.is_file() else None
    rows, torn = read_rows(metrics, where) if metrics.is_file() else ([], False)
    if info is not None:
        _check_ranks(rows, info["world"], where)
    now = time.time() if now is None else now
    run = Run(path, rows, info)
    run.in_progress = _still_running(run, metrics, info_path, now)
    finished = (path / "model").is_dir() and (run.total_steps is None or run.last_step >= run.total_steps)
    if not finished and not run.in_progress and not allow_partial:
        got = f"step {run.last_step}" + (f" of {run.total_steps}" if run.total_steps else "")
        why = "its last line is cut off" if torn else "no final model/ was written"
        raise UserError("run_dir", where, f"is a run that stopped at {got} and is no longer running ({why}): "
                                          "resume it with the same `shoal train ... --out` command, "
                                          "or pass --partial to report the steps it has")
    if torn:
        run.notes.append(f"the last line of {METRICS} was cut off (written while reading, or the run was killed)")
    if not finished:
        run.notes.append(f"the run is {'still running' if run.in_progress else 'incomplete'}: "
                         f"this report shows the {len(rows)} steps written so far")
    if info is None:
        run.notes.append(f"no {RUN_INFO} (a run from an older shoal): no rank grid, schedule or prediction")
    run.checkpoints = _checkpoint_steps(run)
    run.restarts = _restarts(run)
    return run


def read_info(path: Path, where: str, need: tuple[str, ...]) -> dict:
    """run.json as `shoal train` writes it, or a UserError: its fields' kinds, the dotted paths in
    `need` present, and its grid one that train accepted (report and plan --validate read it here)."""
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
    (model.validate, layout.problems); the trainer's own limits of the day (TrainerLimit) are left
    out, so runs from another shoal version still report."""
    from shoal.layout import TrainerLimit, problems
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


def _check_ranks(rows: list[dict], world: int, where: str) -> None:
    """Ranks a row names (the slowest, the stragglers) are ranks of this run."""
    for n, row in enumerate(rows, 1):
        for rank in [row.get("slowest_rank", 0), *row.get("stragglers", [])]:
            if not 0 <= rank < world:
                raise damaged(where, f"{METRICS} line {n} slowest_rank/stragglers", rank, f"a rank from 0 to {world - 1}")


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


def read_rows(path: Path, where: str, need: tuple[str, ...] = REQUIRED) -> tuple[list[dict], bool]:
    """(rows, whether the last line was cut off). Any other bad line, or a field of another kind
    than the trainer writes, means a foreign or damaged file. Blank lines are skipped."""
    lines = path.read_text(errors="replace").split("\n")  # a bad byte fails the line's JSON below
    torn = False
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:  # no newline at the end: a line being written (or a killed writer's last words)
        lines.pop()
        torn = True
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            row = None
        if not isinstance(row, dict) or any(k not in row for k in need):
            raise UserError("run_dir", where, f"{METRICS} line {n} is not a shoal metrics row "
                                              f"(needs {', '.join(need)}); is this a shoal run directory?")
        check_fields(row, ROW_KINDS, f"{METRICS} line {n}", where)
        mem = row.get("memory_by_rank")
        if mem is not None and (len(lengths := {len(mem.get(k, [])) for k in MEMORY_KINDS}) != 1 or 0 in lengths):
            raise damaged(where, f"{METRICS} line {n} memory_by_rank", mem,
                          f"one list per kind ({', '.join(MEMORY_KINDS)}), all of one length")
        rows.append(row)
    return rows, torn


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


def check_fields(record: dict, kinds: dict, name: str, where: str, need: tuple[str, ...] = ()) -> None:
    """UserError for the first field of `record` (in file `name`) not of its kind, or a dotted
    path in `need` that is absent."""
    bad = _mismatch(record, kinds, "")
    if bad:
        path, value, kind = bad
        raise damaged(where, f"{name} {path}", value, _describe(kind))
    for dotted in need:
        value = record
        for key in dotted.split("."):
            value = value.get(key, _Missing()) if isinstance(value, dict) else _Missing()
        if isinstance(value, _Missing):
            raise damaged(where, f"{name} {dotted}", value, "a value (shoal train always writes it)")


def damaged(where: str, field: str, value: object, wants: str) -> UserError:
    shown = value if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return UserError(field, shown, f"expected {wants}; {where} is not a run directory as `shoal train` writes it "
                                   "(damaged or edited): give a run's --out directory, or re-run it")


def _mismatch(value, kind, path: str):
    """(dotted path, value, kind) of the first part of `value` that is not of `kind`, or None."""
    if isinstance(kind, tuple):
        return None if any(_mismatch(value, k, path) is None for k in kind) else (path, value, kind)
    if dataclasses.is_dataclass(kind):
        name, kind = kind.__name__, {f.name: object if f.default is dataclasses.MISSING else type(f.default)
                                     for f in dataclasses.fields(kind)}
        if isinstance(value, dict) and (extra := set(value) - set(kind)):
            key = sorted(extra)[0]
            return f"{path}.{key}", value[key], f"nothing: shoal's {name} has no such field"
    if isinstance(kind, list):
        if not isinstance(value, list):
            return path, value, kind
        return next(filter(None, (_mismatch(v, kind[0], f"{path}[{i}]") for i, v in enumerate(value))), None)
    if isinstance(kind, dict):
        if not isinstance(value, dict):
            return path, value, kind
        checked = ((k, v) for k, v in value.items() if k in kind or str in kind)  # other fields: anything
        return next(filter(None, (_mismatch(v, kind.get(k, kind.get(str)), f"{path}.{k}".lstrip("."))
                                  for k, v in checked)), None)
    if kind is None:
        return None if value is None else (path, value, kind)
    if kind is float:
        kind = (int, float)
    ok = isinstance(value, kind) and (kind in (bool, object) or not isinstance(value, bool))  # true is no number
    return None if ok else (path, value, kind)


def _describe(kind) -> str:
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        return f"a list, each {_describe(kind[0])}"
    if isinstance(kind, dict):
        return "an object" + (f", each value {_describe(kind[str])}" if str in kind else "")
    if isinstance(kind, tuple) and kind != (int, float):
        return " or ".join(map(_describe, kind))
    return {int: "an integer", float: "a number", (int, float): "a number", str: "a string", bool: "true or false",
            dict: "an object", None: "null"}[kind]


def _still_running(run: Run, metrics: Path, info_path: Path, now: float) -> bool:
    newest = max((p.stat().st_mtime for p in (metrics, info_path) if p.is_file()), default=0.0)
    times = [r["step_time_s"] for r in run.rows[-20:]]
    patience = max(STALE_AFTER_S, 20 * statistics.median(times)) if times else STALE_AFTER_S
    return not (run.path / "model").is_dir() and now - newest < patience


def _checkpoint_steps(run: Run) -> list[int]:
    """Steps with a checkpoint: those kept on disk, and every checkpoint.every-th step the run reached."""
    from shoal.checkpoint.store import list_checkpoints

    steps = set()
    ckpt = run.info["config"]["checkpoint"] if run.info else {}
    root = Path(ckpt.get("dir") or "checkpoints")
    root = root if root.is_absolute() else run.path / root
    steps.update(step for step, _ in list_checkpoints(root))
    every = ckpt.get("every", 0)
    if every > 0:  # from the rows, not range(every, last_step): a damaged row's step may be huge
        steps.update(r["step"] for r in run.rows if r["step"] > 0 and r["step"] % every == 0)
    return sorted(steps)


def _restarts(run: Run) -> list[int]:
    """Steps where an attempt resumed: run.json's later starts, and rows whose step goes backwards."""
    steps = {s["step"] for s in (run.info or {}).get("starts", [])[1:] if "step" in s}
    steps.update(b["step"] - 1 for a, b in zip(run.rows, run.rows[1:]) if b["step"] <= a["step"])
    return sorted(steps)


def steady_rows(rows: list[dict]) -> list[dict]:
    """The rows that describe the run's speed: the last attempt's row per step, warm-up left out."""
    from shoal.train.metrics import WARMUP_STEPS

    last = {r["step"]: r for r in rows}  # a restart re-does steps; the later row wins
    ordered = [last[s] for s in sorted(last)]
    return ordered[WARMUP_STEPS:] if len(ordered) > WARMUP_STEPS else ordered
