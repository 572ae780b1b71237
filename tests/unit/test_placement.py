"""Rank -> node placement: which groups cross a node, `shoal mesh --nnodes`, and the training warning."""

import pytest

from conftest import shoal_cli
from shoal.cli.main import main
from shoal.launch.multinode import interface_addrs
from shoal.parallel.mesh import ParallelDims, crosses_nodes, placement_warning, split_groups


def dims(pp=1, dp_replicate=1, dp_shard=1, tp=1, ep=1):
    return ParallelDims(dp_replicate, dp_shard, tp, pp, ep, pp * dp_replicate * dp_shard * tp)


def test_tp_inside_a_node_dp_and_pp_across():
    d = dims(pp=2, dp_shard=2, tp=2)  # 8 ranks on 2 nodes of 4
    assert split_groups(d, 4) == {"pp": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    assert placement_warning(d, 4) == ""
    assert crosses_nodes([3, 4], 4) and not crosses_nodes([4, 7], 4)


@pytest.mark.parametrize("d,per_node,kind,example", [
    (dims(dp_shard=2, tp=2), 1, "tp", "[0,1]"),
    (dims(dp_shard=3, tp=2), 3, "tp", "[2,3]"),  # tp=2 < 3 per node, yet [2,3] straddles nodes 0 and 1
    (dims(dp_shard=4, ep=4), 2, "ep", "[0,1,2,3]"),
])
def test_latency_bound_groups_across_nodes_warn(d, per_node, kind, example):
    line = placement_warning(d, per_node)
    assert line.startswith(f"shoal: warning: {kind} groups span nodes") and example in line and "\n" not in line


def test_one_node_never_warns():
    assert placement_warning(dims(tp=4), 4) == "" and placement_warning(dims(tp=4), 0) == ""


def test_mesh_draws_nodes_and_marks_crossing_groups(capsys):
    assert main(["mesh", "--set", "model.preset=debug", "--set", "parallel.tp=2", "--set", "parallel.pp=2",
                 "--nnodes", "2", "--nproc-per-node", "2"]) == 0
    out, err = capsys.readouterr()
    assert "node 1: rank 2 -> device 0  rank 3 -> device 1" in out
    assert " tp groups: [0,1]  [2,3]\n" in out and " pp groups: [0,2]*  [1,3]*" in out and err == ""
    assert main(["mesh", "--set", "model.preset=debug", "--set", "parallel.tp=2", "--nnodes", "4",
                 "--nproc-per-node", "1"]) == 0
    out, err = capsys.readouterr()
    assert "tp groups: [0,1]*  [2,3]*" in out and err.startswith("shoal: warning: tp groups span nodes")


def test_mesh_json_is_the_grid_every_group_and_what_crosses_a_node(capsys):
    import json

    assert main(["mesh", "--set", "model.preset=debug", "--set", "parallel.tp=2", "--set", "parallel.pp=2",
                 "--nnodes", "2", "--nproc-per-node", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["world"] == 4 and doc["shape"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 2} and doc["ep"] == 1
    assert doc["grid"] == [[[[0, 1]]], [[[2, 3]]]] and doc["per_node"] == 2
    assert doc["groups"] == {"tp": [[0, 1], [2, 3]], "pp": [[0, 2], [1, 3]], "dp": [[0], [1], [2], [3]]}
    assert doc["crossing_nodes"] == {"pp": [[0, 2], [1, 3]]} and doc["warning"] is None and err == ""
    assert main(["mesh", "--set", "model.preset=debug", "--set", "parallel.tp=2", "--nnodes", "4",
                 "--nproc-per-node", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["warning"].startswith("shoal: warning: tp groups span nodes") and "tp" in doc["crossing_nodes"]


@pytest.mark.parametrize("flags,field", [(["--nnodes", "2", "--nproc", "5"], "--nnodes"),
                                         (["--nnodes", "2", "--nproc", "6", "--nproc-per-node", "2"], "--nproc"),
                                         ([], "--nproc")])
def test_mesh_flags_that_disagree(flags, field, capsys):
    assert main(["mesh", "--set", "model.preset=debug", *flags]) == 2
    assert capsys.readouterr().err.startswith(f"shoal mesh: error: {field}=")


def test_training_warns_before_it_starts_when_tp_spans_nodes(tmp_path):
    addr = next((a for a in interface_addrs().values() if not a.startswith("127.")), None)
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    r = shoal_cli("train", "--set", "model.preset=debug", "--set", "parallel.tp=2", "--nnodes", "2", "--nproc", "1",
                  "--master", f"{addr}:29796", "--rdzv-timeout", "1", "--out", str(tmp_path / "run"), timeout=120)
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("shoal: warning: tp groups span nodes (tp=2 with 1 ranks per node"), r.stderr
    # node 1 never comes: the rendezvous gives up after --rdzv-timeout, one line, exit 2
    assert r.returncode == 2 and "did not all join" in lines[-1] and len(lines) == 3, r.stderr


# parallel.rank_order: the same layout, other ranks in each group.

def test_rank_order_changes_which_ranks_form_each_group():
    tp2dp2 = dict(dp_replicate=1, dp_shard=2, tp=2, pp=1, ep=1, world_size=4)
    default, dp_inside = ParallelDims(**tp2dp2), ParallelDims(**tp2dp2, rank_order="dp-tp-pp")
    assert default.groups()["tp"] == [[0, 1], [2, 3]] and dp_inside.groups()["tp"] == [[0, 2], [1, 3]]
    assert dp_inside.groups()["dp"] == [[0, 1], [2, 3]]
    assert dp_inside.coords(2) == {"pp": 0, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 1, "dp": 0}
    pp_inside = ParallelDims(1, 2, 1, 2, 1, 4, rank_order="pp-tp-dp")
    assert pp_inside.groups()["pp"] == [[0, 1], [2, 3]] and split_groups(pp_inside, 2) == {"dp": [[0, 2], [1, 3]]}
    from shoal.report.rank_grid import grid_geometry  # what `shoal mesh --svg` draws

    assert grid_geometry(dp_inside, 2)["crossing"] == {"tp": [[0, 2], [1, 3]], "pp": [], "dp": []}
    line = placement_warning(dp_inside, 2)
    assert "tp groups span nodes" in line and "e.g. [0,2]" in line and "parallel.rank_order=tp-dp-pp" in line


def test_the_mesh_puts_each_rank_where_the_order_says():
    """build_mesh on a fake 4-rank process group (no peers needed): rank 1's groups under dp-tp-pp."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shoal.parallel.mesh import build_mesh

    dist.init_process_group("fake", store=FakeStore(), rank=1, world_size=4)
    try:
        world, _ = build_mesh(ParallelDims(1, 2, 2, 1, 1, 4, rank_order="dp-tp-pp"), "cpu")
        assert world["tp"].mesh.tolist() == [1, 3] and world["dp"].mesh.tolist() == [0, 1]
    finally:
        dist.destroy_process_group()


def test_mesh_cli_and_planner_follow_the_order(capsys):
    assert main(["mesh", "--set", "model.preset=debug", "--set", "parallel.tp=2", "--set", "parallel.rank_order=dp-tp-pp",
                 "--nnodes", "2", "--nproc-per-node", "2"]) == 0
    out, err = capsys.readouterr()
    assert "rank order dp-tp-pp" in out and " tp groups: [0,2]*  [1,3]*" in out and "rank_order" in err

    from shoal.layout import Layout
    from shoal.model.config import PRESETS
    from shoal import hardware
    from shoal.planner.evaluate import evaluate
    from shoal.planner.workload import Cluster, Workload

    wl, cl = Workload(PRESETS["llama3-8b"], 4096, 64), Cluster(hardware.get_gpu("h100"), 16, 8)
    inside, across = (evaluate(wl, Layout(dp_shard=2, tp=8, rank_order=o), cl, check=False)
                      for o in ("tp-dp-pp", "dp-tp-pp"))
    assert inside.time.tp_on_nvlink and not across.time.tp_on_nvlink
    # TP leaves the node and DP moves into it
    assert across.time.tp_comm > inside.time.tp_comm and across.time.dp_comm_total < inside.time.dp_comm_total


def test_a_big_mesh_prints_a_page(capsys):
    """A 100k-rank mesh lists the first and last groups and nodes, not all of them."""
    from shoal.cli.main import main

    assert main(["mesh", "--nproc", "100000", "--per-node", "8", "--set", "train.global_batch=100000"]) == 0
    out = capsys.readouterr().out
    assert len(out) < 10_000 and "12,484 nodes placed the same way" in out and "99,984 more" in out
