"""Node failures that lose nothing: on 2 emulated nodes x 2 ranks (`shoal train --nnodes 2
--max-restarts`), SIGKILL every worker of node b (its agent lives on), later every worker of node a
(which hosts the rendezvous, and worker rank 0 with the job's store); each time both nodes restart,
resume from the newest committed checkpoint, and the run ends bitwise equal to an uninterrupted one."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from shoal.rundir.metrics import read_rows

pytestmark = pytest.mark.timeout(420)

PORT = 29790  # rendezvous on node a (inside the shc* namespaces)
STEPS, EVERY = 12, 2
SETS = ["model.preset=debug", f"train.steps={STEPS}", "train.micro_batch=4", "train.global_batch=8",
        "train.seq_len=64", "train.warmup_steps=2", "train.eval_every=0", "train.eval_batches=1",
        "train.sample_tokens=0", "parallel.tp=2", "parallel.dp_shard=2", f"checkpoint.every={EVERY}"]
ARGS = [a for s in SETS for a in ("--set", s)] + ["--quiet"]


def last_step(out: Path) -> int:
    return next((r["step"] for r in reversed(read_rows(out))), 0)


def workers(launcher: int) -> list[int]:
    """The training workers the launcher (its agent) started: its children running shoal.train."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher \
                    and b"shoal.train" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def test_killing_either_nodes_workers_resumes_bitwise(cluster, tmp_path):
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

    reference = subprocess.run([sys.executable, "-m", "shoal", "train", *ARGS, "--nproc", "4", "--out",
                                str(tmp_path / "reference")], cwd=REPO, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert reference.returncode == 0, reference.stderr[-3000:]
    rows = lambda run: read_rows(tmp_path / run)
    assert [r["step"] for r in rows("run")] == list(range(1, STEPS + 1)), text()
    assert [r["loss"] for r in rows("run")] == [r["loss"] for r in rows("reference")]  # bitwise
    weights = lambda run: (tmp_path / run / "model" / "model.safetensors").read_bytes()
    assert weights("run") == weights("reference")
