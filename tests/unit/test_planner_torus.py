"""A TPU slice is one ICI torus (planner/torus.py): groups get the bandwidth of the axes they span, and a
slice of whole cubes has no slower tier between its 64-chip cubes."""

import dataclasses

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.planner import collectives as coll
from shoal.planner import torus
from shoal.planner.evaluate import evaluate
from shoal.planner.timing import network, step_time
from shoal.planner.workload import Cluster, Workload


def test_slice_shapes_are_googles_topologies():
    assert torus.slice_shape(64, 3) == (4, 4, 4)
    assert torus.slice_shape(128, 3) == (8, 4, 4)
    assert torus.slice_shape(1024, 3) == (16, 8, 8)
    assert torus.slice_shape(8960, 3) == (28, 20, 16)  # a full v5p pod, 16x20x28
    assert torus.slice_shape(256, 2) == (16, 16)  # a v5e pod
    # wraparound only on whole cubes (v5p) or full 16-chip axes (v5e)
    assert torus.has_wraparound((4, 4, 4), 4) and not torus.has_wraparound((4, 2, 2), 4)
    assert torus.has_wraparound((16, 16), 16) and not torus.has_wraparound((8, 8), 16)


def test_groups_span_the_axes_the_mesh_gives_them():
    shape = torus.slice_shape(512, 3)  # 8x8x8
    assert torus.axes_spanned(shape, 8, 1) == (8,)  # tp 8: one axis
    assert torus.axes_spanned(shape, 64, 8) == (8, 8)  # FSDP over the other two
    assert torus.ring_hops((8, 8), True) == 8 and torus.ring_hops((4,), False) == 3


def test_all_gather_bandwidth_adds_up_over_axes():
    # How To Scale Your Model: an all-gather over n axes takes V / (W_bidi * n_axes).
    net = coll.Network(intra_busbw=100e9, intra_latency=0.0, inter_busbw=1e9, inter_latency=0.0,
                       slice_shape=(8, 8, 8))
    S = 1e9
    one = coll.all_gather(S, 8, 512, net.for_group(8, 1))
    two = coll.all_gather(S, 64, 512, net.for_group(64, 8))
    assert one == pytest.approx(S * 7 / 8 / 100e9)
    assert two == pytest.approx(S * 63 / 64 / 200e9)
    assert net.for_group(8, 1).intra_busbw == 100e9 and NET_SWITCHED.for_group(64, 8) is NET_SWITCHED


NET_SWITCHED = coll.Network(intra_busbw=100e9, intra_latency=0.0, inter_busbw=1e9, inter_latency=0.0)


def test_fsdp_does_not_slow_down_when_it_leaves_a_cube():
    # Before: 64-chip cubes were 'nodes' joined at a third of ICI, so FSDP past 64 chips cost ~2x per chip.
    tpu = hardware.get_gpu("tpu-v5p")
    wl = Workload(PRESETS["llama3-70b"], 2048, 128)
    cube = step_time(wl, Layout(dp_shard=8, tp=8, zero=3, micro_batch=16), Cluster(tpu, 64, tpu.gpus_per_node))
    two = step_time(dataclasses.replace(wl, global_batch=256), Layout(dp_shard=16, tp=8, zero=3, micro_batch=16),
                    Cluster(tpu, 128, tpu.gpus_per_node))
    assert two.dp_comm_total == pytest.approx(cube.dp_comm_total, rel=0.1)
    assert network(Cluster(tpu, 128, tpu.gpus_per_node)).slice_shape == (8, 4, 4)
    assert network(Cluster(hardware.get_gpu("h100"), 16, 8)).slice_shape == ()


def test_inner_groups_take_axes_of_their_own_size():
    # PaLM 540B: 12-way model parallelism and 256-way FSDP on a 3,072-chip v4 pod, 12x16x16.
    shape = torus.slice_shape(3072, 3)
    assert sorted(shape) == [12, 16, 16]
    assert torus.axes_spanned(shape, 12, 1) == (12,) and torus.axes_spanned(shape, 256, 12) == (16, 16)


def test_a_tpu_v3_pod_is_a_2d_torus_and_its_plans_say_ici():
    # Cloud's "TPU v3" page: 1,024 chips in a 2D torus, 340 TB/s of all-reduce bandwidth per pod.
    v3 = hardware.get_gpu("TPU v3")
    assert network(Cluster(v3, 1024, v3.gpus_per_node)).slice_shape == (32, 32)
    assert 2 * v3.intra_node_bandwidth * 1024 == pytest.approx(340e12, rel=0.03)
    plan = evaluate(Workload(PRESETS["llama3-8b"], 2048, 256), Layout(dp_shard=128, tp=8, zero=3, micro_batch=2),
                    Cluster(v3, 1024, v3.gpus_per_node))
    assert any(r.startswith("TP comm on ICI") for r in plan.reasons), plan.reasons
