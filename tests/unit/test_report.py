"""shoal report's pieces without a browser: the pipeline arithmetic, the rank grid, reading run directories."""

import json
import os
import time

import pytest

from shoal.errors import UserError
from shoal.parallel.mesh import ParallelDims
from shoal.report.rank_grid import grid_geometry
from shoal.rundir.run import load_run
from shoal.report.schedule import schedule_actions, simulate, textbook_bubble
from shoal.rundir.metrics import read_rows


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(2, 2), (2, 8), (4, 4), (4, 16), (8, 8)])
def test_drawn_bubble_is_the_schedule_arithmetic(schedule, pp, m):
    tl = simulate(schedule, pp, m)
    assert tl.bubble_fraction == pytest.approx(textbook_bubble(pp, m), abs=1e-12)
    assert tl.makespan == 3 * (m + pp - 1)  # forward 1 + backward 2 per micro-batch, plus the fill and drain


@pytest.mark.parametrize("schedule,virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 2)])
def test_every_stage_runs_every_microbatch_once_in_each_direction(schedule, virtual):
    pp, m = 4, 8
    done = [a for acts in schedule_actions(schedule, pp, m, virtual).values() for a in acts]
    back = "I" if schedule == "zero-bubble" else "B"
    for kind in ("F", back):
        assert sorted((s, mb) for k, s, mb in done if k == kind) == [(s, mb) for s in range(pp * virtual) for mb in range(m)]
    if virtual == 1:
        return
    tl = simulate(schedule, pp, m, virtual)
    # interleaving divides the fill and drain by the stages per rank; zero-bubble fills it with weight gradients
    assert tl.bubble_fraction < textbook_bubble(pp, m)
    if schedule == "interleaved-1f1b":
        assert tl.bubble_fraction == pytest.approx((pp - 1) / (virtual * m + pp - 1))


def test_rank_grid_places_ranks_and_names_groups_that_cross_nodes():
    dims = ParallelDims(dp_replicate=1, dp_shard=4, tp=2, pp=2, ep=1, world_size=16)
    geo = grid_geometry(dims, per_node=8)
    assert geo["nodes"] == 2 and geo["place"][9] == (1, 1)
    assert geo["crossing"]["tp"] == [] and geo["crossing"]["dp"] == []  # tp and dp stay inside a node
    assert len(geo["crossing"]["pp"]) == 8  # every pipeline spans both nodes
    assert geo["groups"]["tp"][0] == [0, 1]


def test_a_big_node_is_drawn_in_part_and_a_stopped_drawing_leaves_the_last_one(tmp_path, monkeypatch):
    """A TPU slice is one node of thousands of chips: every device drawn took minutes (coords() of each rank
    searched the whole grid), and a command stopped meanwhile left a truncated SVG."""
    import matplotlib.figure

    from shoal.report.rank_grid import rank_grid_figure

    for order in ("tp-dp-pp", "dp-tp-pp"):  # one sort of the grid puts each rank where the grid holds it
        dims = ParallelDims(dp_replicate=2, dp_shard=2, tp=2, pp=2, ep=1, world_size=16, rank_order=order)
        grid = dims.grid()
        for r, c in enumerate(dims.all_coords()):
            assert grid[c["pp"], c["dp_replicate"], c["dp_shard"], c["cp"], c["tp"]] == r
            assert c["dp"] == c["dp_replicate"] * dims.dp_shard + c["dp_shard"]
    big = ParallelDims(dp_replicate=1, dp_shard=512, tp=1, pp=1, ep=1, world_size=512)
    drawn = {}
    monkeypatch.setattr("shoal.report.rank_grid.save", lambda fig, stem, formats: drawn.setdefault("fig", fig))
    rank_grid_figure(big, per_node=512, stem=tmp_path / "grid", max_devices=32)
    (ax,) = drawn["fig"].axes
    assert len(ax.patches) == 32 + 1 and "devices 0-31 shown" in ax.get_title()  # 32 cells and the node's frame
    monkeypatch.undo()
    svg = rank_grid_figure(big, per_node=512, stem=tmp_path / "grid", formats=("svg",))[0]
    before = svg.read_bytes()

    def stopped(self, fname, **kw):
        open(fname, "w").write("<svg")  # half written when the stop came
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", stopped)
    with pytest.raises(KeyboardInterrupt):
        rank_grid_figure(big, per_node=512, stem=tmp_path / "grid", formats=("svg",))
    assert svg.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["grid.svg"]


ROW = {"step": 1, "loss": 5.0, "lr": 1e-3, "grad_norm": 1.0, "tokens": 512, "tokens_per_s": 100.0, "step_time_s": 0.5,
       "mfu": 0.01, "peak_mem_bytes": 1 << 28, "model_state_bytes": 1 << 20, "comm_bytes": {}}


def write_run(path, steps, finished=True, total=None, extra=""):
    path.mkdir(parents=True, exist_ok=True)
    rows = [dict(ROW, step=s) for s in steps]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + extra)
    if total:
        (path / "run.json").write_text(json.dumps({"shoal_run": 1, "config": {"train": {"steps": total}, "checkpoint":
                                                   {"every": 0, "dir": ""}}, "world": 1, "starts": [{"step": 0}]}))
    if finished:
        (path / "model").mkdir()
    return path


def age(path, seconds):
    for f in path.iterdir():
        os.utime(f, (time.time() - seconds, time.time() - seconds))


@pytest.mark.parametrize("case,words", [
    ("missing", "does not exist"), ("empty", "is empty"), ("foreign", "is not a shoal run"),
    ("foreign-jsonl", "not a shoal metrics row"), ("killed", "stopped at step 3 of 10"), ("file", "is a file")])
def test_bad_run_directories_are_one_user_error(tmp_path, case, words):
    d = tmp_path / "run"
    if case == "empty":
        d.mkdir()
    elif case == "foreign":
        d.mkdir()
        (d / "notes.txt").write_text("hello")
    elif case == "foreign-jsonl":
        d.mkdir()
        (d / "metrics.jsonl").write_text('{"epoch": 1, "acc": 0.5}\n')
    elif case == "killed":
        write_run(d, [1, 2, 3], finished=False, total=10)
        age(d, 3600)
    elif case == "file":
        d.write_text("x")
    with pytest.raises(UserError) as e:
        load_run(d)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("finished", [True, False])
def test_an_emptied_metrics_file_is_named_as_the_reason(tmp_path, finished):
    """A run whose metrics.jsonl was emptied is refused for that, not for a final model/ it may well have."""
    d = write_run(tmp_path / "run", [], finished=finished, total=10)
    age(d, 3600)
    with pytest.raises(UserError) as e:
        load_run(d)
    assert "metrics.jsonl" in str(e.value) and "is empty" in str(e.value) and "no final model" not in str(e.value)


def test_a_run_in_progress_is_read_as_far_as_it_goes(tmp_path):
    d = write_run(tmp_path / "run", [1, 2, 3], finished=False, total=10, extra='{"step": 4, "lo')
    run = load_run(d)  # just written: still running
    assert run.in_progress and [r["step"] for r in run.rows] == [1, 2, 3]
    assert any("still running" in n for n in run.notes) and any("cut off" in n for n in run.notes)
    age(d, 3600)
    with pytest.raises(UserError, match="last line is cut off"):
        load_run(d)
    assert load_run(d, allow_partial=True).last_step == 3


def test_restarts_are_found_from_steps_that_go_back(tmp_path):
    run = load_run(write_run(tmp_path / "run", [1, 2, 3, 4, 3, 4, 5]))
    assert run.restarts == [2]  # the second attempt resumed after step 2


def test_cli_says_what_is_wrong_in_one_line_and_exits_2(tmp_path):
    from conftest import shoal_cli

    r = shoal_cli("report", str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "does not exist" in r.stderr and "Traceback" not in r.stderr


def test_plan_report_imports_no_torch(tmp_path):
    """`shoal plan` never imports torch (DESIGN.md); its --report page must not either."""
    import subprocess
    import sys

    code = ("import sys; from shoal.cli.main import main; "
            f"main(['plan', '--model', 'llama3-8b', '--seq-len', '4096', '--global-batch', '64', '--gpu', 'h100', "
            f"'--gpus', '16', '--report', {str(tmp_path)!r}]); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:5]")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    page = (tmp_path / "index.html").read_text()
    assert page.count("<figure") == 3 and "plan_rank_grid.png" in page


def test_prediction_for_a_gpu_run_has_step_time_and_mfu(tmp_path, monkeypatch):
    """A run that stored no prediction (an older shoal) is planned now, and says so: on a catalog GPU
    with step time and MFU (on the measured MFU's peak), on an unmeasured CPU with memory only."""
    import dataclasses

    from shoal.config import JobConfig
    from shoal.job import resolve
    from shoal.report.predict import predict

    cfg = JobConfig()
    cfg.model.preset, cfg.parallel.tp = "debug", 2
    job = resolve(cfg, 4)
    info = {"config": cfg.to_dict(), "model": dataclasses.asdict(job.model), "layout": dataclasses.asdict(job.layout),
            "world": 4, "local_world": 4, "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}
    found = predict(info, {"step_time_s": 0.5, "mfu": 0.2})
    pred = found.pred
    assert "planned now" in found.source and pred.hardware == "h100-sxm"  # no stored prediction: an old run
    assert pred.step_time_s > 0 and pred.mfu == pytest.approx(0.2 * 0.5 / pred.step_time_s) and pred.memory.total > 0
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))  # no `local` profile measured here
    cpu = predict(dict(info, device="cpu", device_name="cpu")).pred
    assert cpu.step_time_s is None and "shoal plan --gpu local" in cpu.why_no_time and cpu.memory.total > 0


def test_memory_and_communication_are_drawn_per_rank_and_per_dimension(tmp_path):
    """Every rank's memory (the busiest named; past 32 ranks, the highest peaks) and bytes by dimension."""
    from shoal.report.run_report import build_report

    world = 40
    by_rank = {"params": [1 << 20] * world, "grads": [1 << 20] * world, "optimizer": [2 << 20] * world,
               "activations": [3 << 20] * world, "peak": [(100 + r) << 20 for r in range(world)]}
    by_rank["peak"][7] = 900 << 20
    d = write_run(tmp_path / "run", [1, 2, 3, 4, 5])
    rows = read_rows(d)
    rows[0]["memory_by_rank"] = by_rank
    for r in rows:
        r["comm_bytes_by_dim"] = {"all_gather:dp_shard": 3 << 20, "reduce_scatter:dp_shard": 3 << 20, "send:pp": 1 << 20}
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = build_report(d).read_text()
    assert "Busiest rank: 7, 0.88 GiB" in page
    assert "the 32 highest peaks of 40" in page and "ranks 7," in page and "rank 0," not in page
    assert "by parallel dimension: dp_shard 6.00 MiB, pp 1.00 MiB" in page


def test_a_report_that_fails_part_way_leaves_no_folder_it_made(tmp_path, monkeypatch):
    """--out a/b/c: the report folder went again, but the a/b made for it stayed."""
    from shoal.report import run_report

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    d = write_run(tmp_path / "run", [1, 2, 3])
    monkeypatch.setattr(run_report, "render", fail)
    with pytest.raises(OSError):
        run_report.build_report(d, tmp_path / "a" / "b" / "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    (tmp_path / "a").mkdir()  # a folder that was there before stays, with what it held
    (tmp_path / "a" / "mine").write_text("x")
    with pytest.raises(OSError):
        run_report.build_report(d, tmp_path / "a" / "b" / "c")
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["mine"]


def test_a_plan_report_that_fails_part_way_leaves_no_folder_it_made(tmp_path, monkeypatch):
    """`shoal plan --report a/b/c` made its folders and left them, and half a page, on a failure."""
    from shoal.report import plan_report

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plan_report, "render", fail)
    with pytest.raises(OSError):
        plan_report.write_plan_report(tmp_path / "a" / "b" / "c", None, None, "debug")
    assert list(tmp_path.iterdir()) == []
