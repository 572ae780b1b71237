"""A forkserver that dies while importing (an import of forkserver_start.PRELOADS that raises) costs the launch nothing:
each worker starts as a fresh interpreter instead (shoal/launch/forked.py)."""

import os
import subprocess
import sys
from multiprocessing import forkserver, get_context
from pathlib import Path

from torch.distributed.elastic.multiprocessing import api

from shoal.launch import forked, forkserver_start


def test_workers_start_as_fresh_interpreters_when_the_forkserver_dies_importing(tmp_path, monkeypatch):
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('a preload that fails')\n")
    # the forkserver's sys.path is its environment's (Python 3.11's forkserver.main ignores the parent's)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.setitem(forkserver_start.PRELOADS, "json.tool", ("raises_on_import",))  # a worker module, cheap to run
    out = tmp_path / "stdout"
    forkserver._forkserver._stop()  # one an earlier test in this process started would not import again
    try:
        with forked.forked_workers(["-m", "json.tool"]):
            handler = api.get_subprocess_handler(entrypoint=sys.executable, args=("-m", "json.tool", "--help"), env={},
                                                 stdout=str(out), stderr=None, local_rank_id=0)
            assert isinstance(handler, forked._ForkedHandler)
            assert handler.proc.wait(timeout=60) == 0
        assert isinstance(handler.proc, subprocess.Popen)  # not forked._Forked
        assert "usage" in out.read_text()
    finally:
        get_context("forkserver").set_forkserver_preload([])
        forkserver._forkserver._stop()


def test_a_run_refused_after_its_forkserver_started_stops_it(tmp_path, capsys):
    """`shoal train --nproc 2` refused by a check that runs beside the forkserver's imports (here a corpus
    shorter than a batch) stops that forkserver (session.prepare): a caller that goes on, as this test does,
    keeps no process with torch imported until it exits."""
    from shoal.cli.main import main
    from shoal.worker.process import children

    (tmp_path / "tiny.txt").write_text("hello")
    before = set(children(os.getpid()))
    recipe = str(Path(__file__).resolve().parents[2] / "recipes" / "debug.toml")
    code = main(["train", recipe, "--set", f"data.path={tmp_path / 'tiny.txt'}", "--nproc", "2",
                 "--out", str(tmp_path / "run")])
    assert code == 2 and "error: data.path=" in capsys.readouterr().err
    assert forkserver._forkserver._forkserver_pid is None and set(children(os.getpid())) <= before
