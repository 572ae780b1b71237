"""HSDP in the planner (Layout.hsdp_replicas, data_parallel.DataParallel.reduce): each of dp_replicate groups shards
the model over its own dp_shard ranks and all-reduces the reduced gradient shards across the groups, as FSDP2's 2-D
mesh runs it in shoal train (parallel/parallelize.dp_mesh)."""

import json

import pytest

from shoal.hardware.lookup import get_gpu
from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.planner import collectives as coll
from shoal.planner.memory import memory, stage_params
from shoal.planner.timing import network, step_time
from shoal.planner.workload import Cluster, Workload

H100 = get_gpu("h100")
CFG = PRESETS["llama3-8b"]


def _layout(replicas: int, shard: int, zero: int = 3) -> Layout:
    return Layout(dp_replicate=replicas, dp_shard=shard, zero=zero, micro_batch=1, activation_checkpoint="full")


def test_a_replica_group_holds_and_gathers_what_a_job_of_its_size_does_plus_the_all_reduce_across_groups():
    big, small = Cluster(H100, 2048, 8), Cluster(H100, 128, 8)
    wl_big, wl_small = Workload(CFG, 8192, 2048), Workload(CFG, 8192, 128)  # one micro-batch per rank in both
    hsdp, group = _layout(16, 128), _layout(1, 128)
    states = lambda m: m.params + m.grads + m.optimizer  # noqa: E731
    assert states(memory(wl_big, hsdp, big)) == pytest.approx(states(memory(wl_small, group, small)))
    assert states(memory(wl_big, _layout(1, 2048), big)) < states(memory(wl_big, hsdp, big)) / 10

    t_hsdp, t_group = step_time(wl_big, hsdp, big), step_time(wl_small, group, small)
    layer = stage_params(CFG, hsdp, "last", 1).layer_dense
    # each rank's fp32 gradient shard of every layer, all-reduced over the 16 groups (one rank per node apart)
    across = CFG.n_layers * coll.all_reduce(layer * 4 / 128, 16, 1, network(big).for_group(16, 128))
    assert t_hsdp.dp_comm_total - t_group.dp_comm_total == pytest.approx(across, rel=1e-6)
    # A flat ring over 2,048 ranks pays its latency on every layer's gathers: the reason large FSDP jobs run HSDP
    assert step_time(wl_big, _layout(1, 2048), big).step > 1.2 * t_hsdp.step


def test_zero_0_and_1_replicate_or_shard_over_all_of_dp_whatever_the_groups():
    cl, wl = Cluster(H100, 64, 8), Workload(CFG, 8192, 64)
    for zero in (0, 1):
        grouped, flat = _layout(8, 8, zero), _layout(1, 64, zero)
        assert grouped.hsdp_replicas == 1 and grouped.zero_group == 64
        assert memory(wl, grouped, cl).total == memory(wl, flat, cl).total
        assert step_time(wl, grouped, cl).step == step_time(wl, flat, cl).step


def test_dp_replicate_is_pinned_and_searched(capsys):
    from shoal.cli.main import main

    args = ["plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "2048", "--gpu", "h100",
            "--gpus", "2048", "--json", "--top", "1"]
    pinned = ["--dp", "2048", "--tp", "1", "--pp", "1", "--zero", "3", "--micro-batch", "1", "--recompute", "full"]
    assert main(args + pinned + ["--dp-replicate", "16"]) == 0
    strategy = json.loads(capsys.readouterr().out)["plans"][0]["strategy"]
    assert (strategy["dp_replicate"], strategy["dp_shard"], strategy["dp"]) == (16, 128, 2048)
    assert main(args + ["--tp", "1", "--pp", "1", "--zero", "3"]) == 0  # the rest searched: HSDP wins at this scale
    assert json.loads(capsys.readouterr().out)["plans"][0]["strategy"]["dp_replicate"] > 1
