"""Compressed gradient reduction under FSDP2 on 4 gloo ranks (HSDP 2 replicas x 2 shards, and pure
FSDP over 4): degenerate settings equal native HSDP past their warm-up, resume equals an
uninterrupted run, and the dtypes on the wire are the compressed ones, with the uncompressed bytes
beside them. Runs: compression_fsdp_worker.py."""

import pytest

from conftest import REPO, shoal_cli
from shoal.rundir.metrics import read_rows
from test_compression_two_ranks import _diff

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("compression_fsdp")
    r = shoal_cli("run", "--nproc", "4", str(REPO / "tests" / "dist" / "compression_fsdp_worker.py"), str(out),
                  timeout=380)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return out


def test_topk_at_density_one_is_native_hsdp(runs):
    # a/2 + b/2 == (a + b)/2 exactly: halving is exact in binary floating point
    assert _diff(runs, "topk_dense", "plain") == 0.0


def test_powersgd_at_the_gradients_rank_is_native_hsdp_past_its_warmup(runs):
    assert _diff(runs, "powersgd_full", "plain") <= 1e-6
    rows = read_rows(runs / "powersgd_full")
    assert all(r["grad_bytes"] == r["grad_bytes_uncompressed"] for r in rows[:2])  # warm-up: plain
    assert all(r["grad_bytes"] < 0.8 * r["grad_bytes_uncompressed"] for r in rows[2:])  # compressed


@pytest.mark.parametrize("method", ["topk", "powersgd"])
def test_resume_equals_an_uninterrupted_run(runs, method):
    assert _diff(runs, f"{method}_resumed", method, first_step=4) == 0.0


def _last(runs, name) -> dict:
    return read_rows(runs / name)[-1]


INT8_RATIO = 4 / (1 + 4 / 256)  # int8 values plus one fp32 scale per 256


def test_int8_replaces_both_hsdp_collectives(runs):
    """Gradients cross in int8 (fp32 scales beside them): no fp32 reduce-scatter, no fp32 gradient
    all-reduce (the few all-reduce bytes left are the gradient norm's partial sums, as in plain)."""
    row, plain = _last(runs, "int8"), _last(runs, "plain")
    wire = row["comm_bytes_by_dtype"]
    assert wire.keys() == {"all_gather:float32", "all_to_all:int8", "all_to_all:float32", "all_gather:int8",
                           "all_reduce:float32"}, wire  # all_gather:float32: zero=3's parameter gathers
    norm_bytes = wire["all_reduce:float32"]
    # every gradient byte is int8 or its scale (the scales of the all-gather hide among the parameters' fp32)
    assert row["grad_bytes"] == pytest.approx((wire["all_to_all:int8"] + wire["all_gather:int8"]) * (1 + 4 / 256), rel=0.01)
    # the reduce-scatter within dp_shard and the all-reduce across dp_replicate, both ~4x fewer bytes
    assert row["grad_bytes_uncompressed"] == plain["comm_bytes"]["reduce_scatter"] + plain["comm_bytes"]["all_reduce"] - norm_bytes
    assert row["grad_bytes_uncompressed"] / row["grad_bytes"] == pytest.approx(INT8_RATIO, rel=0.03)


def test_int8_reduce_scatters_pure_fsdp(runs):
    row = _last(runs, "int8_fsdp")
    assert "reduce_scatter:float32" not in row["comm_bytes_by_dtype"] and row["comm_bytes_by_dtype"]["all_to_all:int8"] > 0
    assert row["grad_bytes_uncompressed"] / row["grad_bytes"] == pytest.approx(INT8_RATIO, rel=0.03)


@pytest.mark.parametrize("name,replica_wire", [("topk", {"all_gather:float32", "all_gather:int32"}),
                                               ("powersgd", {"all_reduce:float32"})])
def test_topk_and_powersgd_compress_the_replica_all_reduce(runs, name, replica_wire):
    """Within dp_shard the reduce-scatter stays fp32 (the fast link); across replicas fewer bytes."""
    row, plain = _last(runs, name), _last(runs, "plain")
    wire = row["comm_bytes_by_dtype"]
    assert wire.keys() == replica_wire | {"all_gather:float32", "reduce_scatter:float32", "all_reduce:float32"}, wire
    rs = wire["reduce_scatter:float32"]
    assert rs == plain["comm_bytes"]["reduce_scatter"]
    assert row["grad_bytes"] - rs < 0.5 * (row["grad_bytes_uncompressed"] - rs)


def test_bf16_hsdp_counts_both_collectives(runs):
    """Native HSDP in bf16: the reduce-scatter and the replica all-reduce are both gradient bytes."""
    row = _last(runs, "bf16")
    wire = row["comm_bytes_by_dtype"]
    assert "reduce_scatter:float32" not in wire and wire["all_reduce:bfloat16"] > 0
    assert row["grad_bytes"] == wire["reduce_scatter:bfloat16"] + wire["all_reduce:bfloat16"]
    assert row["grad_bytes_uncompressed"] == 2 * row["grad_bytes"]
