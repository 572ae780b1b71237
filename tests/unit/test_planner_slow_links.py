"""The planner's data-parallel term under gradient compression and DiLoCo (planner/slow_links.py):
the gradient bytes shrink by each method's factor, and DiLoCo sends the parameters once per H steps."""

import dataclasses

import pytest

from shoal.layout import Layout
from shoal.model.config import ModelConfig, get_preset
from shoal.hardware.lookup import get_gpu
from shoal.planner.workload import Cluster, Workload
from shoal.planner.slow_links import grad_wire_factor
from shoal.planner.timing import step_time

PLAIN = Workload(get_preset("llama3-8b"), 4096, 512)
LAYOUT = Layout(dp_shard=64, zero=0, micro_batch=1)  # DDP over 64 H100s on 8 nodes
CLUSTER = Cluster(get_gpu("h100"), 64, 8)


def _dp(**changes) -> tuple[float, float]:
    t = step_time(dataclasses.replace(PLAIN, **changes), LAYOUT, CLUSTER)
    return t.dp_comm_total, t.dp_comm


@pytest.mark.parametrize("changes,factor", [
    (dict(grad_compression="bf16"), 1 / 2),
    (dict(grad_compression="int8"), (1 + 4 / 256) / 4),
    (dict(grad_compression="topk", topk_density=0.01), 64 * 0.01),  # all-gathered: grows with the ranks
    (dict(diloco_inner_steps=50), 1 / 50),
    (dict(diloco_inner_steps=50, diloco_quantize="int8"), (1 + 4 / 256) / 4 / 50),
])
def test_the_dp_term_shrinks_by_the_methods_factor(changes, factor):
    total, _ = _dp()
    got, exposed = _dp(**changes)
    # an 8B model's all-reduce is bandwidth-bound: latency, which does not shrink, is < 1% of it
    assert got / total == pytest.approx(factor, rel=0.01)
    if "diloco_inner_steps" in changes:
        assert exposed == got  # the outer all-reduce waits at the end of its step: nothing hides it


def test_an_overlapped_outer_all_reduce_hides_behind_the_steps_beside_it():
    """diloco_overlap_steps: the same bytes, shown only past the steps' kernels it runs beside (and
    the device's ring overlap cost: a ring across 8 nodes of 8 runs at NVLink's pace, so the whole of it);
    int8's all-to-all runs when the fragment lands, so it stays exposed."""
    total, exposed = _dp(diloco_inner_steps=50)
    total1, exposed1 = _dp(diloco_inner_steps=50, diloco_overlap_steps=1)
    assert total1 == total and exposed1 == pytest.approx(CLUSTER.gpu.ring_overlap_cost * total)
    _, exposed8 = _dp(diloco_inner_steps=50, diloco_quantize="int8", diloco_overlap_steps=1)
    assert exposed8 == _dp(diloco_inner_steps=50, diloco_quantize="int8")[1]


def test_powersgd_factor_is_low_rank_bytes_over_full_bytes():
    cfg = ModelConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=4, ffn_hidden=128, vocab_size=256)
    # four 64x64 attention matrices, three 64x128 (or 128x64) FFN ones, embedding and head 256x64
    mats = [(64, 64)] * 4 + [(128, 64)] * 3 + [(256, 64)] * 2
    want = sum((m + k) * 4 for m, k in mats) / sum(m * k for m, k in mats)
    assert grad_wire_factor("powersgd", 8, cfg, rank=4) == pytest.approx(want)
    total, _ = _dp()
    got, _ = _dp(grad_compression="powersgd", powersgd_rank=4)
    # 0.14% of the bytes: here the all-reduce's latency, which does not shrink, is a third of what is left
    assert grad_wire_factor("powersgd", 64, PLAIN.model, rank=4) < got / total < 2 * grad_wire_factor(
        "powersgd", 64, PLAIN.model, rank=4)
