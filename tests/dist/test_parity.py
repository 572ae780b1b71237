"""Loss parity: every parallel layout trains like one process (through `shoal verify`)."""

import json
import re

import pytest

from conftest import shoal_cli

pytestmark = pytest.mark.timeout(600)


def _rows(stdout: str) -> dict[str, tuple[float, str]]:
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"│ (\S+)\s+│ (\S+)\s+│ \S+\s+│ (pass|FAIL)", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), m.group(3))
    return rows


def test_every_default_layout_on_two_ranks():
    """DP at ZeRO 0-3, HSDP, TP with and without SP, four pipeline schedules, MoE with and without EP."""
    r = shoal_cli("verify", "--nproc", "2", "--steps", "4", timeout=540, env={"COLUMNS": "200"})
    rows = _rows(r.stdout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(rows) >= 13, r.stdout
    assert all(result == "pass" and diff <= 1e-4 for diff, result in rows.values()), r.stdout
    # the layouts that run on 2 ranks are really all there
    for must in ("zero=1", "zero=0", "tp=2", "pp_schedule=zero-bubble", "pp_schedule=interleaved-1f1b", "ep=2"):
        assert any(must in layout for layout in rows), (must, list(rows))


def test_composed_layouts_on_four_ranks(tmp_path):
    layouts = (
        "tp=2,pp=2;tp=2,dp_shard=2,zero=2;dp_replicate=2,dp_shard=2,zero=3;model=debug-moe,ep=2,dp_shard=4,zero=3;"
        "model=debug-moe,ep=2,dp_shard=2,pp=2,pp_schedule=gpipe;pp=2,dp_shard=2,zero=3,pp_schedule=zero-bubble;"
        "pp=2,dp_shard=2,zero=1,pp_schedule=gpipe;tp=2,dp_shard=2,zero=1")
    r = shoal_cli("verify", "--nproc", "4", "--steps", "3", "--layouts", layouts, "--out", str(tmp_path), timeout=540,
                  env={"COLUMNS": "200"})
    rows = _rows(r.stdout)
    assert r.returncode == 0 and len(rows) == 8, r.stdout[-3000:] + r.stderr[-3000:]
    assert all(result == "pass" for _, result in rows.values()), r.stdout
    # four ranks on (here) two cores: MFU is against the cores the job has, not four ranks' worth
    mfus = [json.loads(line)["mfu"] for f in tmp_path.glob("layout*/metrics.jsonl") for line in f.read_text().splitlines()]
    assert len(mfus) == 8 * 3 and all(0 < m <= 1 for m in mfus), mfus


def test_a_wrong_layout_fails_verification():
    """The check can fail: a 1% different learning rate on the parallel side must show as a mismatch."""
    r = shoal_cli("verify", "--nproc", "2", "--steps", "3", "--layouts", "dp_shard=2,zero=3,train.lr=0.00101",
                  env={"COLUMNS": "200"}, timeout=300)
    assert r.returncode == 1, r.stdout[-2000:]
    assert "FAIL" in r.stdout
