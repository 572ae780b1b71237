"""`shoal doctor --nproc 4` end to end: environment verdicts, a busbw table that follows nccl-tests, a plot.

Small sizes only (the default goes to 256 MiB); the formulas themselves are checked against
timings the test chooses in tests/unit/test_measure_doctor.py. Here every printed row must be
self-consistent: algbw = bytes / time and busbw = algbw x the op's nccl-tests factor for n = 4.
"""

from __future__ import annotations

import re

import pytest

from shoal.comm.ops import BENCH_OPS as OPS, bus_factor
from tests.conftest import shoal_cli

ROW = re.compile(r"^│ (\w+)\s+│ ([\d.]+ \w+)\s+│\s+(\d+) │\s+([\d.]+) │\s+([\d.e+-]+) │\s+([\d.e+-]+) │$")


@pytest.mark.timeout(150)
def test_doctor_four_ranks(tmp_path):
    r = shoal_cli("doctor", "--nproc", "4", "--max-size", "4K", "--budget", "0.02", "--out", str(tmp_path),
                  timeout=140, env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for check in ("versions", "backends", "shared memory", "open files", "free ports", "rendezvous"):
        assert re.search(rf"│ {check}\s+│ (ok|warn|info)\s+│", out), check
    rows = [m.groups() for m in map(ROW.match, out.splitlines()) if m]
    assert {op for op, *_ in rows} == set(OPS)
    assert len(rows) == len(OPS) * 2  # 1 KiB and 4 KiB
    for op, _, nbytes, time_us, algbw, busbw in rows:
        t = float(time_us) * 1e-6
        assert float(algbw) == pytest.approx(int(nbytes) / t / 1e9, rel=2e-3), (op, nbytes, time_us, algbw)
        assert float(busbw) == pytest.approx(float(algbw) * bus_factor(op, 4), rel=2e-3), (op, algbw, busbw)
    for what in ("compute", "link"):  # a straggler verdict for each (this shared machine may have one)
        assert re.search(rf"^({what}: no straggler|straggler: rank \d+ {what} )", out, re.M), out[-1500:]
    assert (tmp_path / "comm_busbw.png").stat().st_size > 10_000
