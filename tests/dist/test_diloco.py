"""DiLoCo on 2 gloo ranks, two replica groups (parallel/diloco.py): the degenerate setting equals data
parallelism, bytes fall H-fold, streaming fragments sync on their schedule and cover every parameter
once, the dtype on the wire is the one asked for, and a resume mid-round equals an uninterrupted
run. Runs: diloco_worker.py. The sign of the outer step: tests/unit/test_diloco_outer.py."""

import pytest

from conftest import REPO, shoal_cli
from shoal.rundir.metrics import read_rows
from shoal.train.parity import weight_diff

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("diloco")
    r = shoal_cli("run", "--nproc", "2", str(REPO / "tests" / "dist" / "diloco_worker.py"), str(out), timeout=280)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def _rows(runs, name) -> dict[int, dict]:
    return {r["step"]: r for r in read_rows(runs / name)}


def _sent(row) -> int:
    return sum(row["comm_bytes"].values())


def _diff(runs, a: str, b: str, first_step: int = 1) -> float:
    """Largest difference in loss over the steps both ran, and in final weights."""
    ra, rb = _rows(runs, a), _rows(runs, b)
    steps = [s for s in ra if s >= first_step]
    assert steps and set(steps) <= set(rb), (a, b, sorted(ra), sorted(rb))
    return max(max(abs(ra[s]["loss"] - rb[s]["loss"]) for s in steps), weight_diff(runs / a / "model", runs / b / "model"))


def test_h1_with_inner_sgd_outer_lr_1_momentum_0_is_data_parallel_sgd(runs):
    assert _diff(runs, "diloco_h1_sgd", "plain_sgd") <= 1e-6
    # and it trained: SGD moved the loss, so equality is not two runs that stood still
    rows = _rows(runs, "plain_sgd")
    assert rows[10]["loss"] < rows[1]["loss"] - 0.05


def test_cross_group_bytes_fall_h_fold(runs):
    """Plain DDP all-reduces every step; DiLoCo with H=5 sends the same fp32 model-sized all-reduce
    at steps 5 and 10 only."""
    plain, diloco = _rows(runs, "plain"), _rows(runs, "diloco_h5")
    assert [s for s, r in diloco.items() if _sent(r)] == [5, 10]
    assert sum(map(_sent, plain.values())) == pytest.approx(5 * sum(map(_sent, diloco.values())), rel=1e-3)
    assert set().union(*(r["comm_bytes_by_dtype"] for r in diloco.values())) == {"all_reduce:float32"}


def test_outer_copy_and_momentum_are_counted_as_optimizer_state(runs):
    """AdamW keeps two fp32 copies of the parameters; DiLoCo's outer copy and momentum are two more
    (the planner counts the same: planner/slow_links.py)."""
    plain, diloco = (_rows(runs, n)[1]["memory_by_rank"]["optimizer"] for n in ("plain", "diloco_h5"))
    assert diloco == [2 * b for b in plain] and all(plain)


def test_streaming_fragments_sync_on_their_schedule_and_cover_the_model_once(runs):
    """H=4, F=2: fragment 1 at steps 2 and 6 (step % 4 == 2), fragment 0 at 4 (step % 4 == 0), and
    both at the last step; the two fragments together are exactly one full-model all-reduce."""
    rows, full = _rows(runs, "stream"), _sent(_rows(runs, "diloco_h5")[5])
    assert [s for s, r in rows.items() if _sent(r)] == [2, 4, 6, 8]
    assert _sent(rows[2]) + _sent(rows[4]) == full == _sent(rows[8])
    assert 0.4 * full < _sent(rows[2]) < 0.6 * full  # about half each: the peak per step halves


@pytest.mark.parametrize("name,wire,fewer", [
    ("stream_bf16", {"all_reduce:bfloat16"}, 2.0),
    ("stream_int8", {"all_to_all:int8", "all_to_all:float32", "all_gather:int8", "all_gather:float32"}, 4 / (1 + 4 / 256)),
    # two 4-bit values to a byte
    ("stream_fp4", {"all_to_all:uint8", "all_to_all:float32", "all_gather:uint8", "all_gather:float32"}, 4 / (0.5 + 4 / 256)),
])
def test_quantized_pseudo_gradient_on_the_wire(runs, name, wire, fewer):
    rows = _rows(runs, name)
    assert set(rows[2]["comm_bytes_by_dtype"]) == wire
    full = _sent(_rows(runs, "diloco_h5")[5])  # the same parameters in fp32, all-reduced
    assert full / _sent(rows[2]) == pytest.approx(fewer, rel=0.03)


def test_resume_mid_round_equals_an_uninterrupted_run(runs):
    """Saved at step 3, between fragment syncs: the outer copy, momentum and each group's own
    weights and AdamW state come back, so steps 4-8 and the final weights match bit for bit."""
    assert _diff(runs, "stream_resumed", "stream", first_step=4) == 0.0


def test_overlapped_fragments_send_as_streaming_does_and_land_later(runs):
    """tau = 2: the same bytes at the same steps as without overlap (sent, then reduced beside the
    next steps), but the outer steps land two steps later (fragment 1's after step 3, where the save
    applies it, not 2; fragment 0's after 6, not 4), so steps 3 and 5 train on other weights; the save after step 3 applied fragment 1's transfer, so resuming there continues bit
    for bit, and the run ends on one model as every DiLoCo run does."""
    overlap, stream = _rows(runs, "overlap"), _rows(runs, "stream")
    assert [s for s, r in overlap.items() if _sent(r)] == [2, 4, 6, 8]
    assert [_sent(overlap[s]) for s in (2, 4, 6, 8)] == [_sent(stream[s]) for s in (2, 4, 6, 8)]
    assert [overlap[s]["loss"] for s in (1, 2)] == [stream[s]["loss"] for s in (1, 2)]
    assert overlap[3]["loss"] != stream[3]["loss"] and overlap[5]["loss"] != stream[5]["loss"]
    assert _diff(runs, "overlap_resumed", "overlap", first_step=4) == 0.0
