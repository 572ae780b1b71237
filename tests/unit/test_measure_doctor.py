"""nccl-tests bandwidth formulas and the doctor's rows, against timings the test chooses."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from shoal.cli.doctor import render_rows, straggler_lines
from shoal.comm import ops
from shoal.debug import stragglers
from shoal.errors import UserError
from shoal.measure import doctor
from tests.conftest import shoal_cli

GB = 1e9


def test_bus_factors_follow_nccl_tests():
    assert ops.bus_factor("all_reduce", 4) == pytest.approx(1.5)  # 2(n-1)/n
    assert ops.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert ops.bus_factor(op, 4) == pytest.approx(0.75)  # (n-1)/n
    for op in ("broadcast", "sendrecv"):
        assert ops.bus_factor(op, 4) == 1.0
    assert ops.busbw("all_reduce", 2 * 10**9, 1.0, 2) == pytest.approx(2e9)


RAW = {  # four ranks; the test controls every time
    "world": 4, "backend": "gloo",
    "results": [
        {"op": "all_reduce", "size": 2**20, "iters": 10, "times": [0.001, 0.002, 0.0015, 0.001]},
        {"op": "all_gather", "size": 4 * 2**18, "iters": 10, "times": [0.0005] * 4},
        {"op": "reduce_scatter", "size": 2**22, "iters": 5, "times": [0.004, 0.004, 0.004, 0.008]},
        {"op": "all_to_all", "size": 2**20, "iters": 10, "times": [0.002] * 4},
        {"op": "broadcast", "size": 2**20, "iters": 10, "times": [0.001] * 4},
        {"op": "sendrecv", "size": 2**20, "iters": 10, "times": [0.001, 0.001, 0.001, 0.004]},
    ],
    "compute_gflops": [20.0, 21.0, 19.0, 9.0],
}


def test_summarize_uses_the_slowest_rank_and_nccl_tests_formulas():
    rep = doctor.summarize(RAW)
    rows = {r.op: r for r in rep.rows}
    ar = rows["all_reduce"]
    assert ar.time_s == 0.002  # the collective ends when the slowest rank does
    assert ar.algbw == pytest.approx(2**20 / 0.002)
    assert ar.busbw == pytest.approx(2**20 / 0.002 * 2 * 3 / 4)
    assert rows["all_gather"].busbw == pytest.approx(2**20 / 0.0005 * 3 / 4)
    assert rows["reduce_scatter"].busbw == pytest.approx(2**22 / 0.008 * 3 / 4)
    assert rows["all_to_all"].busbw == pytest.approx(2**20 / 0.002 * 3 / 4)
    assert rows["broadcast"].busbw == rows["broadcast"].algbw
    assert rows["sendrecv"].busbw == pytest.approx(2**20 / 0.004)
    assert rep.slow_compute == {3: pytest.approx(9.0 / 19.5)}  # below 0.7x the median speed
    assert list(rep.slow_link) == [3]  # its own ring exchange took 4x as long


def test_json_and_table_show_those_numbers():
    """`shoal doctor --json` carries the rows as numbers; the table a person reads prints the same ones."""
    rep = doctor.summarize(RAW)
    row = next(r for r in rep.as_dict()["rows"] if r["op"] == "all_reduce")
    assert (row["size"], row["time_s"]) == (2**20, pytest.approx(0.002))
    assert row["busbw"] == pytest.approx(row["algbw"] * 1.5) == pytest.approx(2**20 / 0.002 * 1.5)
    assert rep.as_dict()["slow_compute"] == {3: pytest.approx(9.0 / 19.5)}
    buf = io.StringIO()
    Console(file=buf, width=200).print(render_rows(rep))
    line = next(line for line in buf.getvalue().splitlines() if "all_reduce" in line and "MiB" in line)
    for shown in ("1 MiB", "1048576", "2000.0", f"{2**20 / 0.002 / GB:.4g}", f"{2**20 / 0.002 / GB * 1.5:.4g}"):
        assert shown in line, (shown, line)
    lines = straggler_lines(rep)
    assert "straggler[/]: rank 3 compute 9 GFLOP/s" in lines and "rank 3 link" in lines


def test_straggler_rule():
    assert stragglers.slow_ranks([10, 10, 10, 6.9]) == {3: pytest.approx(0.69)}
    assert stragglers.slow_ranks([10, 10, 10, 7.1]) == {}
    s = stragglers.spread([0.10, 0.10, 0.30, 0.11])
    assert s["slowest_rank"] == 2 and s["stragglers"] == [2]
    assert s["compute_time_spread"] == pytest.approx(0.30 / 0.105)


def test_sizes_and_units():
    assert doctor.parse_size("256M") == 256 * 2**20 and doctor.parse_size("1K") == 1024
    assert doctor.sizes(1024, 256 * 2**20, 4)[-1] == 256 * 2**20 and len(doctor.sizes(1024, 256 * 2**20, 4)) == 10
    with pytest.raises(UserError):
        doctor.parse_size("12Q")


def test_doctor_bad_size_is_one_line_and_exit_2():
    r = shoal_cli("doctor", "--max-size", "12Q", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--max-size" in r.stderr


@pytest.mark.parametrize("argv,flag", [
    (["--rdzv-timeout", "-1"], "--rdzv-timeout"), (["--rdzv-timeout", "0", "--checks-only"], "--rdzv-timeout"),
    (["--ops", "bogus", "--checks-only"], "--ops"), (["--checks-only", "--max-size", "1G"], "--max-size"),
    (["--checks-only", "--out", "elsewhere"], "--out"), (["--ops", "bogus"], "--ops")])
def test_doctor_refuses_a_flag_it_would_ignore_or_cannot_use_before_running(argv, flag, capsys, monkeypatch, tmp_path):
    """Each was accepted silently (a timeout of -1 on one machine; benchmark flags with --checks-only,
    which runs no benchmark), or refused only after the environment checks."""
    from shoal.cli.main import main
    from shoal.measure import envcheck

    def ran(*a, **k):
        raise AssertionError("the checks ran")

    monkeypatch.setattr(envcheck, "run_all", ran)
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shoal doctor: error: {flag}="), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,flag", [
    (["--peak", "--nproc", "4"], "--nproc"), (["--peak", "--checks-only"], "--checks-only"),
    (["--peak", "--max-size", "1G"], "--max-size"), (["--peak", "--ops", "all_gather"], "--ops"),
    (["--peak", "--out", "elsewhere"], "--out"), (["--peak", "--nnodes", "2"], "--nnodes"),
    (["--peak", "--master", "10.0.0.1"], "--master"), (["--peak", "--rdzv", "static"], "--rdzv"),
    (["--precision", "bf16"], "--precision"), (["--checks-only", "--precision", "bf16"], "--precision")])
def test_doctor_peak_refuses_the_flags_it_does_not_use(argv, flag, capsys, monkeypatch, tmp_path):
    """--peak times one matmul and printed it, ignoring --nproc 4 or --nnodes 2 silently; --precision,
    the dtype of that matmul, was as silently ignored without --peak."""
    from shoal.cli.main import main
    from shoal.hardware import peak
    from shoal.measure import envcheck

    def ran(*a, **k):
        raise AssertionError("it ran")

    monkeypatch.setattr(peak, "compare", ran)
    monkeypatch.setattr(envcheck, "run_all", ran)
    monkeypatch.chdir(tmp_path)
    assert main(["doctor", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"shoal doctor: error: {flag}="), err
    assert "--peak" in err[0] and list(tmp_path.iterdir()) == []


def test_doctor_peak_with_its_own_flags_still_runs(capsys, monkeypatch):
    from shoal.cli.main import main
    from shoal.hardware import peak

    monkeypatch.setattr(peak, "compare", lambda precision: [("datasheet", 1e12, f"{precision} test")])
    assert main(["doctor", "--peak", "--precision", "bf16", "--json"]) == 0
    assert '"bf16 test"' in capsys.readouterr().out
