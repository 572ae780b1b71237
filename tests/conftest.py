import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` (tests/cuda) need a GPU: skipped where torch sees none; `pytest -m cuda` runs them."""
    cuda_tests = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_tests:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
        for item in cuda_tests:
            item.add_marker(skip)


LAUNCHING_TIERS = ("tests/dist/", "tests/integration/", "tests/cluster/")


@pytest.fixture(scope="session", autouse=True)
def _test_run_cache(tmp_path_factory, request):
    """Token caches and CPU calibration go to a folder of this test run's unless SHOAL_CACHE_DIR is set: under
    pytest-xdist one for all its workers (their common base folder), which shoal.cache.one_filler lets one
    of them fill while the other waits, where each measured the machine and tokenized corpora on its own.

    A session that launches workers has the machine measured before its first test: a launcher that found
    the other pytest worker measuring it said "shoal: waiting for another process to finish ...", a line
    the tests that read a launch's whole stderr do not expect (test_launcher_signals' SIGINT case failed)."""
    if "SHOAL_CACHE_DIR" not in os.environ:
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
        (shared / "shoal-cache").mkdir(exist_ok=True)
        os.environ["SHOAL_CACHE_DIR"] = str(shared / "shoal-cache")
    if any(item.nodeid.startswith(LAUNCHING_TIERS) for item in request.session.items):
        from shoal.hardware.local import local_gpu

        local_gpu()
    yield


def shoal_cli(*args: str, timeout: float = 120, env: dict | None = None):
    """Run `python -m shoal ARGS` in a subprocess; returns the CompletedProcess."""
    import subprocess

    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=full_env)


def shoal_here(capsys, *args: str):
    """`shoal ARGS` run in this process, for a refusal: what shoal_cli returns, without the seconds a
    new process spends importing torch before `shoal train` refuses. Keep one real launch (shoal_cli)
    per command, which alone sees what a fresh interpreter prints."""
    import subprocess

    from shoal.cli.main import main

    capsys.readouterr()  # what the test printed before
    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["shoal", *args], code, out, err)


def train_here(out, *sets):
    """What `shoal train --set SET... --out OUT --quiet` trains, in this process with a launched run's one
    thread (the thread count changes how sums split): no new interpreter importing torch for each run.
    Keep one real launch (shoal_cli) beside it."""
    import torch

    from shoal.config import load_config
    from shoal.train.trainer import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(None, list(sets)), out, show=False)
    finally:
        torch.set_num_threads(threads)


# The run the chaos (tests/dist) and node-failure (tests/cluster) tests must each end bitwise equal to
# after their kills: tp 2 x dp_shard 2 on 4 ranks. Each test adds its own checkpoint.every.
UNINTERRUPTED_STEPS = 12
UNINTERRUPTED = ["model.preset=debug", f"train.steps={UNINTERRUPTED_STEPS}", "train.micro_batch=4", "train.global_batch=8",
                 "train.seq_len=64", "train.warmup_steps=2", "train.eval_every=0", "train.eval_batches=1",
                 "train.sample_tokens=0", "parallel.tp=2", "parallel.dp_shard=2"]


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """The UNINTERRUPTED run on 4 ranks, never killed and never checkpointed, launched once per session
    (a 4-rank launch costs seconds per worker): its folder."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    r = shoal_cli("train", *[a for s in UNINTERRUPTED for a in ("--set", s)], "--quiet", "--nproc", "4",
                  "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out
