"""Tensor parallelism leaves no gradient pending a sum: after forward_backward the sequence-parallel
norms' weight gradients are reduced once, so the gradient norm and AdamW's step issue one all-reduce
(the norm's), not one per read of each partial gradient (37 on the debug model before the fix).
Runs: tp_gradients_worker.py."""

import json

import pytest

from conftest import REPO, shoal_cli

pytestmark = pytest.mark.timeout(200)


def test_no_partial_gradients_reach_the_optimizer(tmp_path):
    r = shoal_cli("run", "--nproc", "2", str(REPO / "tests" / "dist" / "tp_gradients_worker.py"), str(tmp_path), timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"partial": [], "all_reduces": 1}
