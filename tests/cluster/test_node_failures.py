"""Node failures that lose nothing: on 2 emulated nodes x 2 ranks (`shoal train --nnodes 2
--max-restarts`), SIGKILL every worker of node b (its agent lives on), later every worker of node a
(which hosts the rendezvous, and worker rank 0 with the job's store); each time both nodes restart,
resume from the newest committed checkpoint, and the run ends bitwise equal to an uninterrupted one."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, UNINTERRUPTED, UNINTERRUPTED_STEPS
from shoal.rundir.metrics import read_rows
from shoal.testing.processes import workers

pytestmark = pytest.mark.timeout(420)

PORT = 29790  # rendezvous on node a (inside the shc* namespaces)
STEPS, EVERY = UNINTERRUPTED_STEPS, 2
SETS = [*UNINTERRUPTED, f"checkpoint.every={EVERY}"]
ARGS = [a for s in SETS for a in ("--set", s)] + ["--quiet"]


def last_step(out: Path) -> int:
    return next((r["step"] for r in reversed(read_rows(out))), 0)


def test_killing_either_nodes_workers_resumes_bitwise(cluster, uninterrupted, tmp_path):
    import os
    import signal

    out, head = tmp_path / "run", f"{cluster.nodes[0].addr}:{PORT}"
    logs = [(tmp_path / f"node{k}.log") for k in (0, 1)]
    launchers = {}
    for k in (1, 0):  # node 1 first: it waits for node 0's rendezvous
        argv = [sys.executable, "-m", "shoal", "train", *ARGS, "--nnodes", "2", "--node-rank", str(k), "--master",
                head, "--nproc", "2", "--max-restarts", "3", "--out", str(out)]
        launchers[k] = cluster.popen(cluster.nodes[k], argv, {}, stdout=logs[k].open("w"), stderr=subprocess.STDOUT,
                                     cwd=REPO)
    text = lambda: "\n".join(p.read_text()[-4000:] for p in logs)
    # node b's workers after step 3, then node a's (worker rank 0, the job's store) after step 7
    for n, (node, after) in enumerate([(1, 3), (0, 7)]):
        deadline = time.monotonic() + 200
        while not (last_step(out) >= after and text().count("resuming from step") >= n
                   and len(pids := workers(launchers[node].pid)) == 2):
            assert time.monotonic() < deadline and all(p.poll() is None for p in launchers.values()), text()
            time.sleep(0.05)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    codes = [p.wait(timeout=300) for p in launchers.values()]
    assert codes == [0, 0], text()
    resumed = [line for line in logs[0].read_text().splitlines() if "resuming from step" in line]  # rank 0 is on a
    assert len(resumed) == 2, text()

    rows = read_rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), text()
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_rows(uninterrupted)]  # bitwise
    weights = lambda run: (run / "model" / "model.safetensors").read_bytes()
    assert weights(out) == weights(uninterrupted)
