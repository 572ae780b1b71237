"""Chaos: SIGKILL workers of a 4-rank 2-D run at random steps; the elastic agent restarts them, they
resume from the last checkpoint, and the run ends bitwise identical to one that was never interrupted."""

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, UNINTERRUPTED, UNINTERRUPTED_STEPS
from shoal.rundir.metrics import read_rows
from shoal.testing.processes import worker

pytestmark = pytest.mark.timeout(420)

STEPS, EVERY = UNINTERRUPTED_STEPS, 3
RUN = [a for o in [*UNINTERRUPTED, f"checkpoint.every={EVERY}"] for a in ("--set", o)] + ["--quiet"]


def start(out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "shoal", "train", *RUN, "--nproc", "4", "--out", str(out), *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def last_step(out: Path) -> int:
    return next((r["step"] for r in reversed(read_rows(out))), 0)


def test_sigkill_at_random_steps_resumes_bitwise(tmp_path, uninterrupted):
    rng = random.Random(int(os.environ.get("SHOAL_CHAOS_SEED", time.time_ns() % 10_000)))
    kills = sorted(rng.sample(range(2, STEPS - 1), 3))
    ranks = [rng.randrange(4) for _ in kills]
    print(f"chaos plan: SIGKILL rank {ranks} at steps {kills}")

    t0 = time.perf_counter()
    chaos = start(tmp_path / "chaos", "--max-restarts", "3")
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(chaos.stdout), daemon=True)
    reader.start()
    for attempt, (step, rank) in enumerate(zip(kills, ranks)):
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and chaos.poll() is None:
            resumed = attempt == 0 or sum(f"elastic restart {attempt} of" in line for line in output) > 0
            if resumed and last_step(tmp_path / "chaos") >= step:
                pid = worker(chaos.pid, rank, attempt)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    break
            time.sleep(0.02)
        else:
            chaos.kill()
            pytest.fail(f"kill {attempt} at step {step} never happened:\n" + "".join(output)[-4000:])
    assert chaos.wait(timeout=300) == 0, "".join(output)[-4000:]
    reader.join(timeout=10)
    chaos_s = time.perf_counter() - t0
    text = "".join(output)

    # Every failure was noticed, restarted and resumed, losing at most checkpoint.every steps.
    assert text.count("was killed by SIGKILL; restarting all 4 workers") == 3, text[-4000:]
    lost = [int(n) for n in re.findall(r"so (\d+) steps? (?:is|are) lost", text)]
    assert len(lost) == 3 and all(0 <= n <= EVERY for n in lost), text[-4000:]
    print(f"chaos run {chaos_s:.0f}s, steps lost per failure: {lost}")

    chaos_rows = read_rows(tmp_path / "chaos")
    assert [r["step"] for r in chaos_rows] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in chaos_rows] == [r["loss"] for r in read_rows(uninterrupted)]  # bitwise
    weights = lambda run: (run / "model" / "model.safetensors").read_bytes()
    assert weights(tmp_path / "chaos") == weights(uninterrupted)
