"""Energy, CO2 and the carbon-aware start window (shoal/planner/energy.py, `shoal plan --region/--carbon-trace`)."""

import json
import math
import os
import subprocess
import sys

import pytest

from shoal.errors import UserError
from shoal.planner import energy


def daily_curve(days: int = 3, start_hour: int = 12) -> energy.Trace:
    """A synthetic grid: 100 g/kWh at 02:00, 500 at 14:00, a cosine between; the trace starts at noon."""
    hours = [(start_hour + h) % 24 for h in range(24 * days)]
    return energy.Trace([f"d{(start_hour + h) // 24} {hh:02d}:00" for h, hh in enumerate(hours)],
                        [300 + 200 * math.cos(2 * math.pi * (hh - 14) / 24) for hh in hours])


def test_energy_is_gpus_power_hours_pue():
    used = energy.energy(64, 700, 10, pue=1.25, region="france")
    assert used.kwh == pytest.approx(64 * 0.7 * 10 * 1.25)
    assert used.co2_kg == pytest.approx(used.kwh * energy.GRID_INTENSITY["france"] / 1000)
    assert energy.energy(8, 400, 1, pue=1.0).co2_kg is None  # no region, no CO2


def test_best_start_is_the_night_trough():
    trace = daily_curve()
    w = energy.best_start(trace, 4)
    # A 4-hour run centred on 02:00 starts at 00:00, hour 12 of a trace that begins at noon.
    assert w.start_index == 12 and w.start_label == "d1 00:00"
    assert w.grams_per_kwh == pytest.approx(sum(trace.grams_per_kwh[12:16]) / 4)
    assert w.now_grams_per_kwh == pytest.approx(sum(trace.grams_per_kwh[:4]) / 4)
    assert w.saving > 0.6  # noon to 16:00 burns ~5x what midnight to 04:00 does


def test_runs_longer_than_a_day_save_little_and_wrap():
    trace = daily_curve(days=1)
    w = energy.best_start(trace, 24 * 5 + 0.5)  # whole days average out; only the half hour differs
    assert w.saving < 0.01 and w.grams_per_kwh == pytest.approx(300, rel=0.01)
    assert energy.best_start(trace, 24).saving == pytest.approx(0, abs=1e-9)
    assert energy.best_start(trace, float("inf")) is None  # a run that never ends has no best start


def test_trace_file_and_bad_input(tmp_path):
    good = tmp_path / "grid.csv"
    good.write_text("time,gco2_per_kwh\n2025-01-01T00:00,300\n2025-01-01T01:00, 120.5\n# a comment\n\n")
    trace = energy.read_trace(good)
    assert trace.grams_per_kwh == [300, 120.5] and trace.labels[1] == "2025-01-01T01:00"
    days = tmp_path / "two_days.csv"  # hours named by hour of day repeat from one day to the next
    days.write_text("".join(f"{h:02d}:00,{300 - 100 * (2 <= h <= 5)}\n" for h in list(range(24)) * 2))
    assert energy.best_start(energy.read_trace(days), 4).start_index == 2
    bad = tmp_path / "bad.csv"
    bad.write_text("time,g\n2025-01-01T00:00,300\n2025-01-01T01:00,lots\n")
    with pytest.raises(UserError, match="line 3"):
        energy.read_trace(bad)
    with pytest.raises(UserError, match="no such file"):
        energy.read_trace(tmp_path / "missing.csv")
    with pytest.raises(UserError, match="known"):
        energy.region_intensity("atlantis")
    with pytest.raises(UserError, match="at least 1.0"):
        energy.check_pue(0.8)


BASE = ["--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "256", "--gpu", "h100", "--gpus", "64",
        "--top", "1"]


def plan(*args):
    env = dict(os.environ, SHOAL_CACHE_DIR="/nonexistent-shoal-cache")
    return subprocess.run([sys.executable, "-m", "shoal", "plan", *BASE, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_plan_json_carries_energy_and_the_window(tmp_path):
    csv = tmp_path / "grid.csv"
    trace = daily_curve()
    csv.write_text("".join(f"{t},{v}\n" for t, v in zip(trace.labels, trace.grams_per_kwh)))
    out = plan("--tokens", "2e10", "--carbon-trace", str(csv), "--pue", "1.1", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    best = doc["plans"][0]
    hours = best["expected_days"] * 24
    assert best["energy_kwh"] == pytest.approx(64 * 0.7 * hours * 1.1)
    w = doc["carbon_window"]
    assert w["saving"] > 0.3 and w["gco2_per_kwh"] == pytest.approx(best["grid_gco2_per_kwh"])
    assert best["co2_kg"] == pytest.approx(best["energy_kwh"] * w["gco2_per_kwh"] / 1000)
    region = json.loads(plan("--tokens", "2e10", "--region", "sweden", "--json").stdout)["plans"][0]
    assert region["co2_kg"] == pytest.approx(region["energy_kwh"] * 40 / 1000)


@pytest.mark.parametrize("args,field", [
    (["--tokens", "1T", "--region", "atlantis"], "region='atlantis'"),
    (["--tokens", "1T", "--carbon-trace", "/nonexistent/grid.csv"], "carbon_trace="),
    (["--tokens", "1T", "--pue", "0.9"], "pue=0.9"),
    (["--region", "france"], "tokens="),
])
def test_bad_energy_input_is_one_line_and_exit_2(tmp_path, args, field):
    out = plan(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and field in lines[0], out.stderr


def test_unparseable_trace_names_the_line(tmp_path):
    csv = tmp_path / "grid.csv"
    csv.write_text("time,g\n00:00,300\n01:00,n/a\n")
    out = plan("--tokens", "1T", "--carbon-trace", str(csv))
    assert out.returncode == 2 and "line 3" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_huge_budget_prints_its_numbers_short():
    """`--mtbf-hours 1e300` printed all 301 digits of the MTBF, over four lines, and `--tokens 1e300 --region us`
    as many of its tonnes of CO2 (render.amount); ordinary ones keep their thousands separators."""
    from shoal.planner import cost
    from shoal.planner.render import energy_lines, training_lines

    def mtbf_line(hours):
        return training_lines(cost.estimate(1e12, 1e6, 64, usd_per_gpu_hour=2.0, mtbf_gpu_hours=hours,
                                            checkpoint_interval_hours=1, restart_hours=0.25,
                                            checkpoint_write_hours=0))[1]

    assert "(per-GPU MTBF 1e+300 h)" in mtbf_line(1e300)
    assert "(per-GPU MTBF 50,000 h)" in mtbf_line(50_000)
    huge = energy_lines(energy.energy(64, 700, 1e290, region="us"))[0]
    assert len(huge) < 160 and " t CO2 at " in huge, huge
    assert "1,989.1 t CO2" in energy_lines(energy.energy(64, 700, 100_000, region="us"))[0]


@pytest.mark.parametrize("flag,value", [("--pue", "1.5"), ("--mtbf-hours", "10"), ("--region", "us")])
def test_a_budget_flag_without_tokens_is_refused(flag, value, capsys, monkeypatch):
    """--pue and --mtbf-hours act on a whole run's energy and failures: without --tokens they were taken and
    dropped with exit 0, while --region was refused; all three are one line now, before any sweep."""
    from shoal.cli.main import main
    from shoal.planner import request

    monkeypatch.setattr(request.scaling, "sweep", lambda *a, **k: pytest.fail("swept"))
    assert main(["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "256", "--gpu", "h100",
                 "--scale", "8:16", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"shoal plan: error: --tokens=None: {flag} is for a whole run (its energy, CO2 or failures): give "
                   "its size with --tokens (e.g. 1T)"]
