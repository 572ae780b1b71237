"""<out>/profile/: the torch.profiler traces of debug.profile_steps and their summaries.

    profile/rank<N>.trace.json     Chrome/Perfetto trace of the profiled steps on rank N (https://ui.perfetto.dev)
    profile/rank<N>.summary.json   what `shoal report` shows of it: written by the rank beside its trace

A summary holds the top ops by self time (from torch.profiler's own table) and the profiled steps'
time split three ways, from the trace's events inside the `ProfilerStep#N` windows:

- communication: the union of the intervals of collective and point-to-point ops (names of NCCL
  kernels on a GPU; on a CPU c10d/gloo ops and the spans FSDP marks as all-gather or reduce,
  which hold the waits for gloo);
- compute: the rest of the time anything ran (GPU kernels, or CPU ops on the training thread);
- idle: the steps' time when nothing ran (on a GPU: no kernel; on a CPU: Python and launch overhead).
Compute that overlaps communication counts as communication: the point is what a step waits for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from shoal.rundir.names import PROFILE

_COMM = re.compile(r"nccl|gloo|c10d|all_?reduce|all_?gather|reduce_?scatter|broadcast|all_?to_?all|"
                   r"\bsend\b|\brecv\b|barrier|_wait|wait_tensor|backward_reduce", re.IGNORECASE)


def trace_path(out: Path, rank: int) -> Path:
    return out / PROFILE / f"rank{rank}.trace.json"


def summary_path(out: Path, rank: int) -> Path:
    return out / PROFILE / f"rank{rank}.summary.json"


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _length(intervals, windows) -> float:
    """Time of `intervals` (merged) inside `windows` (merged), in the trace's units (us)."""
    return sum(max(0.0, min(b, wb) - max(a, wa)) for a, b in intervals for wa, wb in windows)


def time_split(events: list[dict]) -> dict:
    """{"steps": [N...], "step_us", "compute_us", "comm_us", "idle_us", "busy_source"} of a trace's events."""
    complete = [e for e in events if e.get("ph") == "X" and isinstance(e.get("dur"), (int, float))]
    marks = [e for e in complete if str(e.get("name", "")).startswith("ProfilerStep#")]
    windows = _union([(e["ts"], e["ts"] + e["dur"]) for e in marks])
    kernels = [e for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if kernels:
        busy, source = kernels, "GPU kernels"
    else:  # CPU: the ops of the thread that ran the steps, and the spans FSDP marks as communication
        threads = {(e.get("pid"), e.get("tid")) for e in marks}  # (they hold its waits for gloo's threads)
        busy = [e for e in complete if (e.get("pid"), e.get("tid")) in threads and (
            e.get("cat") == "cpu_op" or (e.get("cat") == "user_annotation" and _COMM.search(str(e.get("name", "")))))]
        source = "CPU ops on the training thread"
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in busy if _COMM.search(str(e.get("name", "")))])
    anything = _union([(e["ts"], e["ts"] + e["dur"]) for e in busy])
    step_us = sum(b - a for a, b in windows)
    comm_us, busy_us = _length(comm, windows), _length(anything, windows)
    return {"steps": sorted(int(e["name"].split("#")[1]) for e in marks if e["name"].split("#")[1].isdigit()),
            "step_us": step_us, "compute_us": busy_us - comm_us, "comm_us": comm_us,
            "idle_us": max(0.0, step_us - busy_us), "busy_source": source}


def write_summary(out: Path, rank: int, top_ops: list[dict]) -> dict:
    """Summarize rank's trace (already written) into its summary file; `top_ops`: [{"name", "calls",
    "self_us"}], torch.profiler's key averages, largest first."""
    trace = json.loads(trace_path(out, rank).read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    summary = {"rank": rank, **time_split(events), "top_ops": top_ops, "trace": trace_path(out, rank).name}
    summary_path(out, rank).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def read_summaries(out: Path) -> list[dict]:
    """Every rank's profile summary in <out>, by rank; unreadable ones left out (a run killed while
    writing one), since the report shows what there is."""
    found = []
    for path in sorted((out / PROFILE).glob("rank*.summary.json")) if (out / PROFILE).is_dir() else []:
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and isinstance(summary.get("rank"), int) and isinstance(summary.get("top_ops"), list):
            found.append(summary)
    return sorted(found, key=lambda s: s["rank"])
