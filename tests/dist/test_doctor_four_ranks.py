"""`shoal doctor --nproc 4` end to end: environment verdicts, a busbw table that follows nccl-tests, a plot.

Small sizes only (the default goes to 256 MiB); the formulas themselves are checked against
timings the test chooses in tests/unit/test_measure_doctor.py. Here every row `--json` prints must
be self-consistent: algbw = bytes / time and busbw = algbw x the op's nccl-tests factor for n = 4.
"""

from __future__ import annotations

import json

import pytest

from shoal.comm.ops import BENCH_OPS as OPS, bus_factor
from tests.conftest import shoal_cli


@pytest.mark.timeout(150)
def test_doctor_four_ranks(tmp_path):
    r = shoal_cli("doctor", "--nproc", "4", "--max-size", "4K", "--budget", "0.02", "--out", str(tmp_path), "--json",
                  timeout=140)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(r.stdout)
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    for check in ("versions", "backends", "shared memory", "open files", "free ports", "rendezvous"):
        assert verdicts[check] in ("ok", "warn", "info"), (check, verdicts)
    rows = report["rows"]
    assert {row["op"] for row in rows} == set(OPS) and report["world"] == 4
    assert len(rows) == len(OPS) * 2  # 1 KiB and 4 KiB
    for row in rows:
        assert row["algbw"] == pytest.approx(row["size"] / row["time_s"]), row
        assert row["busbw"] == pytest.approx(row["algbw"] * bus_factor(row["op"], 4)), row
    assert len(report["compute_gflops"]) == len(report["link_gbps"]) == 4  # each rank's own, for the stragglers
    assert report["figure"] == str(tmp_path / "comm_busbw.png") and (tmp_path / "comm_busbw.png").stat().st_size > 10_000
