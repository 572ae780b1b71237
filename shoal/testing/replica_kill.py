"""Run `shoal train --replica-groups N` and SIGKILL one group's worker mid-run (for tests and bench/).

The kill lands on the worker process itself (not its launcher), by pid, once the group's own
metrics.jsonl shows the chosen step: exactly what a crashed GPU or an OOM-killed rank looks like
to the group's elastic agent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shoal.launch.forkserver_start import FORK_ENV
from shoal.rundir.metrics import read_rows
from shoal.rundir.names import JOB, replica_dir
from shoal.testing.processes import cmdline, descendants, workers


@dataclass
class ReplicaRun:
    exit_code: int
    rows: list[list[dict]]  # each group's metrics.jsonl rows, group 0 first
    killed_at: int | None   # the victim group's last logged step when its worker was killed
    log: str                # the launcher's stdout and stderr


def run_replica_groups(recipe: str, out: Path, overrides: list[str], groups: int = 2, nproc: int = 1,
                       kill_group: int | None = None, kill_at: int = 0, timeout_s: float = 280) -> ReplicaRun:
    """Train with `groups` replica groups of `nproc` workers; kill group `kill_group`'s first worker
    when it has logged step `kill_at` (no kill when kill_group is None).

    The workers start as fresh interpreters (SHOAL_FORK_WORKERS=0): a forked worker is back within a
    second, before the other groups step alone, and a restart on a real cluster (a new process, CUDA,
    NCCL) takes longer than either; a fresh interpreter's ~5 s of imports stands in for that."""
    cmd = [sys.executable, "-m", "shoal", "train", recipe, "--replica-groups", str(groups), "--nproc", str(nproc),
           "--max-restarts", "2", "--out", str(out), "--quiet", *[f"--set={o}" for o in overrides]]
    log = Path(f"{out}.log")
    deadline = time.monotonic() + timeout_s
    with open(log, "w") as sink:
        launcher = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=dict(os.environ, **{FORK_ENV: "0"}))
        killed_at = None
        try:
            if kill_group is not None:
                victim = replica_dir(out, kill_group)
                while (rows := read_rows(victim))[-1:] == [] or rows[-1]["step"] < kill_at:
                    if launcher.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the run ended or stalled before group {kill_group} reached step {kill_at}")
                    time.sleep(0.02)
                os.kill(_worker_of(launcher.pid, victim), signal.SIGKILL)
                killed_at = rows[-1]["step"]
            code = launcher.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
    return ReplicaRun(code, [read_rows(replica_dir(out, k)) for k in range(groups)], killed_at, log.read_text())


def _worker_of(launcher: int, group_dir: Path) -> int:
    """The first worker of the group writing to group_dir: launcher -> group launcher -> worker."""
    group = next(p for p in descendants(launcher) if f"--job {group_dir / JOB} " in cmdline(p) + " "
                 and "shoal.launch.replica_groups" in cmdline(p))
    return workers(group)[0]
