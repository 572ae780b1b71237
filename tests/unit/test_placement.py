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
