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


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Token caches and CPU calibration go to a per-session folder unless SHOAL_CACHE_DIR is set."""
    if "SHOAL_CACHE_DIR" not in os.environ:
        os.environ["SHOAL_CACHE_DIR"] = str(tmp_path_factory.mktemp("shoal-cache"))
    yield


def shoal_cli(*args: str, timeout: float = 120, env: dict | None = None):
    """Run `python -m shoal ARGS` in a subprocess; returns the CompletedProcess."""
    import subprocess

    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=full_env)
