"""model_state_bytes and comm_bytes against the ZeRO paper's memory and the ring-algorithm volumes."""


import pytest

from conftest import shoal_cli
from shoal.model.analytics import param_counts
from shoal.model.config import get_preset
from shoal.rundir.metrics import read_rows

pytestmark = pytest.mark.timeout(400)
N = 2
P = param_counts(get_preset("debug")).total
RING = (N - 1) / N
ACCUMULATION = 2  # verify's runs: global batch 8 = micro-batch 2 x 2 micro-batches x 2 ranks
B = 8  # bytes an element: verify's runs compute in float64 (shoal/train/parity.py)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("accounting")
    layouts = ["dp_shard=2,zero=3", "dp_shard=2,zero=2", "dp_shard=2,zero=1", "dp_replicate=2,dp_shard=1,zero=0"]
    r = shoal_cli("verify", "--nproc", str(N), "--steps", "3", "--layouts", ";".join(layouts), "--out", str(out),
                  timeout=380)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    last = {}
    for i, layout in enumerate(layouts):
        rows = read_rows(out / f"layout{i}")
        last[layout.split(",")[-1]] = rows[-1]  # step 3: optimizer state exists
    return last


@pytest.mark.parametrize("zero,expected", [
    ("zero=3", 4 * B * P / N),            # params, grads and AdamW's two moments all sharded
    ("zero=2", 4 * B * P / N),            # FSDP2 re-shards parameters after backward: at rest like zero=3
    ("zero=1", 2 * B * P + 2 * B * P / N),  # ZeRO-1: only the optimizer state sharded
    ("zero=0", 4 * B * P),                # plain replication
])
def test_model_state_bytes(runs, zero, expected):
    assert runs[zero]["model_state_bytes"] == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("zero,kind,expected", [
    # ZeRO-3 gathers for forward and again for backward, in every micro-batch
    ("zero=3", "all_gather", 2 * ACCUMULATION * RING * B * P),
    # sharded gradients are reduce-scattered after every micro-batch, so they stay sharded
    ("zero=3", "reduce_scatter", ACCUMULATION * RING * B * P),
    ("zero=2", "all_gather", RING * B * P),        # gathered once, kept through every micro-batch
    ("zero=2", "reduce_scatter", ACCUMULATION * RING * B * P),
    ("zero=1", "all_reduce", 2 * RING * B * P),    # DDP's gradient all-reduce
    ("zero=1", "broadcast", RING * B * P),         # each rank broadcasts the parameters it updated
    ("zero=0", "all_reduce", 2 * RING * B * P),
])
def test_comm_bytes_match_ring_volumes(runs, zero, kind, expected):
    assert runs[zero]["comm_bytes"].get(kind, 0) == pytest.approx(expected, rel=0.05)
