"""`shoal report` pages opened in a real headless chromium from file://.

Runs are made once per module with the debug model, 6 steps each (a few seconds): one rank with a
restart (pp = 1), two ranks pipelined with 1F1B and with zero-bubble (pp = 2; the page's schedule is
simulated from the layout, every schedule's arithmetic in tests/unit/test_report.py, so one schedule
with a stage per rank and one with two suffice), tp 2 x dp 2 on four ranks, and ep 2 (MoE) on two.
"""

import shutil

import pytest

from browser import blank, chromium, figures, load
from conftest import shoal_cli, shoal_here
from shoal.report.run_report import SECTION_IDS

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium not installed (make's set-up installs it)")

BASE = ["--set", "model.preset=debug", "--set", "train.steps=6", "--set", "train.global_batch=8",
        "--set", "train.seq_len=64", "--set", "train.sample_tokens=0", "--set", "train.eval_every=3", "--quiet"]


def train(out, *args, nproc=1, quiet=True):
    r = shoal_cli("train", *BASE[: len(BASE) - (not quiet)], *args, "--out", str(out),
                  *(["--nproc", str(nproc)] if nproc > 1 else []), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-runs")
    # One rank, killed after step 6 before its final save: the rerun resumes from the step-4 checkpoint.
    r = train(root / "restart", "--set", "checkpoint.every=2", quiet=False)
    assert f"pictures of this run: shoal report {root / 'restart'}" in r.stdout  # the summary points here
    shutil.rmtree(root / "restart" / "model")
    shutil.rmtree(root / "restart" / "checkpoints" / "step_00000006")
    train(root / "restart", "--set", "checkpoint.every=2")
    train(root / "pp2", "--set", "parallel.pp=2", "--set", "parallel.pp_schedule=zero-bubble", nproc=2)
    train(root / "pp2-1f1b", "--set", "parallel.pp=2", "--set", "parallel.pp_schedule=1f1b", nproc=2)
    train(root / "tpdp", "--set", "parallel.tp=2", nproc=4)
    train(root / "ep", "--set", "model.preset=debug-moe", "--set", "parallel.ep=2", nproc=2)
    return root


def report(run_dir, capsys=None):
    """`shoal report RUN_DIR`: launched, or with capsys run in this process (no torch import to wait for)."""
    r = shoal_here(capsys, "report", str(run_dir)) if capsys else shoal_cli("report", str(run_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    page = run_dir / "report" / "index.html"
    assert r.stdout.strip() == f"report: {page}"
    return page


def check_page(page, work, section_ids=SECTION_IDS):
    got = load(page, work)
    assert got.requests == [], got.requests
    assert got.console == [], got.console
    for sid in section_ids:
        assert f'<section id="{sid}">' in got.dom, sid
    figs = figures(got.dom)
    assert figs and all(alt and caption for alt, caption in figs), figs
    assert not blank(got.screenshot)
    return got, figs


@pytest.mark.parametrize("name,pipeline", [("restart", None), ("pp2", "zero-bubble"), ("pp2-1f1b", "1f1b"),
                                           ("tpdp", None), ("ep", None)])
def test_run_page_in_a_browser(runs, tmp_path, capsys, name, pipeline):
    page = report(runs / name, None if name == "restart" else capsys)  # one real launch of the command
    got, figs = check_page(page, tmp_path)
    captions = " ".join(c for _, c in figs)
    assert "Loss and eval loss" in captions
    assert "Every rank on its node" in captions
    if pipeline:
        assert f"The {pipeline} schedule per rank over time" in captions
        assert (runs / name / "report" / "pipeline.svg").is_file()
    else:
        assert "No pipeline (pp = 1)" in got.dom
    if name == "pp2-1f1b":  # 2 stages, 2 micro-batches of 4: (p-1)/(m+p-1) = 1/3
        assert "with 2 stages and 2 micro-batches: bubble 33.3% of the step (the textbook (p-1)/(m+p-1) = 33.3%)" in got.dom
    if name == "restart":
        assert "<th>restarts from steps</th><td>4</td>" in got.dom
        assert "<th>checkpoints at steps</th><td>2, 4, 6</td>" in got.dom
    if name in ("tpdp", "ep"):
        assert "Step-time spread across ranks" in captions and "bytes rank 0 sent per step" in captions.lower()
        assert "the measurement of each rank" in captions and "Busiest rank:" in got.dom
        carried = got.dom.split("per steady step, by parallel dimension:")[1].split("</p>")[0]
        assert name[:2] in carried, carried  # tp's or ep's bytes told by their dimension
    for stem in ("training", "rank_grid", "memory", "communication", "prediction"):
        assert (runs / name / "report" / f"{stem}.png").is_file() and (runs / name / "report" / f"{stem}.svg").is_file()


def test_plan_report_and_mesh_svg_in_a_browser(tmp_path):
    r = shoal_cli("plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "256", "--gpu", "h100",
                  "--gpus", "32", "--scale", "8:64", "--report", str(tmp_path / "plan"))
    assert r.returncode == 0, r.stderr[-2000:]
    from shoal.report.plan_report import SECTION_IDS as PLAN_SECTIONS

    _, figs = check_page(tmp_path / "plan" / "index.html", tmp_path / "browser", PLAN_SECTIONS)
    assert len(figs) == 4  # rank grid, memory, step time, scaling
    m = shoal_cli("mesh", "--nproc", "8", "--set", "parallel.tp=2", "--set", "parallel.pp=2", "--per-node", "4",
                  "--svg", str(tmp_path / "grid.svg"))
    assert m.returncode == 0, m.stderr
    svg = (tmp_path / "grid.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg


def test_the_browser_checks_catch_a_bad_page(tmp_path):
    # The checks above would pass on an empty list; this page fetches from the network and logs an error.
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="http://example.invalid/x.png" alt="x">'
                   '<script>console.error("boom")</script></body></html>')
    got = load(bad, tmp_path / "browser")
    assert got.requests == ["http://example.invalid/x.png"]
    assert any("boom" in line for line in got.console)
    empty = tmp_path / "empty.html"
    empty.write_text("<!DOCTYPE html><html><body></body></html>")
    assert blank(load(empty, tmp_path / "browser2").screenshot)
