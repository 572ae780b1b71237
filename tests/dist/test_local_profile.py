"""The `local` profile measures this machine for the planner (shoal/measure/local_profile.py), two
gloo processes included: every rate it reports is a real one, and DTensor's host work per kernel of a
tensor-parallel layer shows as more than a plain op's dispatch, and its redistribution as more than
the bare collective."""

import json
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.timeout(150)


def test_profile_measures_every_rate_the_planner_reads(tmp_path):
    out = tmp_path / "profile.json"
    r = subprocess.run([sys.executable, "-m", "shoal.measure.local_profile", "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    profile = json.loads(out.read_text())
    for key in ("matmul_fp32_flops", "copy_bandwidth", "gloo_busbw", "gloo_latency", "kernel_overhead",
                "kernel_overhead_all_cores"):
        assert profile[key] > 0, key
    assert 0.02 < profile["attention_efficiency"] < 2  # causal SDPA against the matmul rate (0.34 here)
    assert profile["tp_kernel_overhead"] > profile["kernel_overhead"]  # ~117 us against ~10 us here
    # a sequence-parallel collective on DTensors costs more than the same collective on flat buffers
    assert profile["tp_redistribute_latency"] + profile["tp_redistribute_per_byte"] * 4 * 2**20 > 0
