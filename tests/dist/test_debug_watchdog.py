"""The hang watchdog on 3 gloo ranks: a rank that sleeps forever, and a rank that is SIGKILLed.

Each test starts `shoal run --nproc 3`, reads the merged output line by line as it arrives, and
checks that the single hang report names the stuck or dead rank and what the others wait on,
within hang_timeout_s + 10 s of the fault, and that the job then exits non-zero.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

HANG_TIMEOUT_S = 3

SCRIPT = r'''
import os, signal, sys, time
import torch
import shoal.debug
if sys.argv[2] != "flag":  # else `shoal run --hang-timeout` turned it on, without touching the script
    shoal.debug.enable(hang_timeout_s=float(sys.argv[2]))
import torch.distributed as dist

dist.init_process_group("gloo")
rank, fault = dist.get_rank(), sys.argv[1]
x = torch.ones(8)
for step in range(1000):
    shoal.debug.progress(step, "forward")
    if step == 2 and rank == 1:
        print(f"FAULT {fault}", flush=True)
        if fault == "sleep":
            time.sleep(1000)  # @sleep
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(x)  # @all-reduce
    time.sleep(0.02)
'''


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SCRIPT.splitlines()) if text.rstrip().endswith(f"# @{marker}"))


def run_with_fault(tmp_path, fault: str, by_flag: bool = False) -> tuple[int, str, float]:
    """(exit code, merged output, seconds from the fault to the report's first line)."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.lstrip("\n"))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", SHOAL_DEBUG_DIR=str(tmp_path / "debug"))
    flags = ["--hang-timeout", str(HANG_TIMEOUT_S)] if by_flag else []
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "run", "--nproc", "3", *flags, str(script), fault,
                             "flag" if by_flag else str(HANG_TIMEOUT_S)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, t_fault, t_report = [], None, None
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("FAULT") and t_fault is None:
                t_fault = time.monotonic()
            if "shoal hang report" in line and t_report is None:
                t_report = time.monotonic()
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    out = "".join(lines)
    assert t_fault is not None and t_report is not None, out[-6000:]
    return code, out, t_report - t_fault


def _report(out: str) -> str:
    start = out.index("shoal hang report")
    return out[start:out.index("=" * 40, start + 40)]


@pytest.mark.timeout(120)
def test_rank_sleeping_forever_is_named(tmp_path):
    """Also the `shoal run --hang-timeout` path: the script itself never calls enable()."""
    code, out, delay = run_with_fault(tmp_path, "sleep", by_flag=True)
    report = _report(out)
    assert code == 124, out[-4000:]  # the job exits non-zero so an elastic restart can take over
    assert delay < HANG_TIMEOUT_S + 10, delay
    assert re.search(rf"rank 1: NOT in a collective: step 2, phase 'forward' at \S*job.py:{_line('sleep')}", report), report
    assert re.search(rf"ranks 0,2: in all_reduce #3 on group 0 at \S*job.py:{_line('all-reduce')}.* -- waiting for rank 1",
                     report), report
    assert "likely cause: rank 1" in report
    for r in range(3):  # every live rank dumped its own stack and last collectives
        assert re.search(rf"shoal: rank {r}: .*\n  this rank: .*\n  last collectives:", out), out[-4000:]
    assert (tmp_path / "debug" / "hang_report.txt").read_text().startswith("=" * 24 + " shoal hang report")


@pytest.mark.timeout(120)
def test_killed_rank_is_reported_dead(tmp_path):
    code, out, delay = run_with_fault(tmp_path, "kill")
    report = _report(out)
    assert code != 0
    assert delay < HANG_TIMEOUT_S + 10, delay
    assert re.search(r"rank 1: DEAD: process \d+ on \S+ is gone", report), report
    assert re.search(r"ranks 0,2: in all_reduce #3 on group 0 at \S*job.py:\d+.* -- waiting for rank 1", report), report
    assert "likely cause: rank 1" in report
