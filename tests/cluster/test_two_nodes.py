"""Two nodes x two ranks under real `torchrun --nnodes 2` train like one process."""

import json
import subprocess
import sys
import time

import pytest

from conftest import REPO

pytestmark = pytest.mark.timeout(300)

PORT = 29780  # rendezvous on node a (the shc* namespaces have their own port space; this is ours by convention)
STEPS = 3
# One layout per kind of group that crosses the node boundary: the DP group (FSDP over 4 ranks),
# DP across with TP inside each node, PP across with TP inside.
LAYOUTS = ["dp_shard=4,zero=3", "tp=2,dp_shard=2", "tp=2,pp=2,dp_shard=1"]


def _reference(out, float64: bool):
    """The one-process run every 2 x 2 run is compared with (the verify settings, global batch 16):
    in float64 for verify's workers (shoal/train/parity.py), in fp32 for `shoal train`."""
    from contextlib import nullcontext

    import torch

    from shoal.train.trainer import train
    from shoal.train.parity import config_for, in_float64

    cfg = config_for("dp_shard=1", 1, STEPS, global_batch=16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count: sums split the same way
    try:
        with in_float64(cfg) if float64 else nullcontext():
            train(cfg, out, show=False)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _reference(tmp_path_factory.mktemp("reference"), float64=False)


@pytest.fixture(scope="module")
def verify_reference(tmp_path_factory):
    return _reference(tmp_path_factory.mktemp("verify-reference"), float64=True)


def test_verify_layouts_on_two_nodes_match_one_process(cluster, verify_reference, tmp_path):
    from shoal.train.parity import compare

    t0 = time.time()
    argv = ["-m", "shoal.train.parity", str(tmp_path), "4", str(STEPS), json.dumps(LAYOUTS)]
    procs = [cluster.torchrun(k, 2, PORT, f"parity-{t0:.0f}", argv, stdout=(tmp_path / f"node{k}.log").open("w"),
                              stderr=subprocess.STDOUT) for k in range(2)]
    codes = [p.wait(timeout=240) for p in procs]
    logs = "\n".join((tmp_path / f"node{k}.log").read_text()[-3000:] for k in range(2))
    assert codes == [0, 0], logs
    results = [compare(layout, tmp_path / f"layout{i}", verify_reference, 1e-4) for i, layout in enumerate(LAYOUTS)]
    print(f"2 nodes x 2 ranks, {len(LAYOUTS)} layouts x {STEPS} steps: {time.time() - t0:.1f} s")
    for r in results:
        print(f"{r.layout:28s} loss {r.loss_diff:.1e} grad {r.grad_diff:.1e} weights {r.weight_diff:.1e}")
    assert all(r.passed for r in results), [(r.layout, r.loss_diff, r.grad_diff, r.weight_diff) for r in results]


def test_shoal_train_sets_up_two_nodes_by_itself(cluster, reference, tmp_path):
    """`shoal train --nnodes 2 --node-rank K --master A:PORT` on each node, with none of the settings
    the torchrun test above passes by hand (interface, local address, is_host, store): TP inside each
    node, DP across, the same training as one process."""
    from shoal.train.parity import base_overrides, compare

    head = f"{cluster.nodes[0].addr}:{PORT + 1}"
    # checkpoint.every: the run first checks that --out is one directory for both nodes (it is here)
    sets = [f"--set={o}" for o in base_overrides(STEPS, 16) + ["parallel.tp=2", f"checkpoint.every={STEPS}"]]
    procs = []
    for k in (1, 0):  # node 1 first: it waits for node 0's rendezvous
        argv = [sys.executable, "-m", "shoal", "train", "--nnodes", "2", "--node-rank", str(k), "--master", head,
                "--nproc", "2", "--out", str(tmp_path / "run"), "--quiet", *sets]
        procs.append(cluster.popen(cluster.nodes[k], argv, {}, stdout=(tmp_path / f"node{k}.log").open("w"),
                                   stderr=subprocess.STDOUT, cwd=REPO))
    codes = [p.wait(timeout=240) for p in procs]
    logs = "\n".join((tmp_path / f"node{k}.log").read_text()[-3000:] for k in (1, 0))
    assert codes == [0, 0], logs
    assert f"node 0 of 2 ({cluster.nodes[0].addr} on {cluster.nodes[0].ifname}) hosts the rendezvous" in logs
    assert f"node 1 of 2 ({cluster.nodes[1].addr} on {cluster.nodes[1].ifname}) joins the rendezvous" in logs
    r = compare("tp=2 x dp=2 over 2 nodes", tmp_path / "run", reference, 1e-4)
    assert r.passed, (r, logs)


NODE = """
import sys
from shoal.launch.multinode import launch_nodes, plan_node
k, master, rdzv = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.exit(launch_nodes(["-c", f"import time; time.sleep({2 * k})"], 1, plan_node(2, k, master, rdzv=rdzv)))
"""


@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_a_job_whose_last_node_is_not_the_host_ends_quietly(cluster, rdzv):
    """Node 1's worker finishes 2 s after node 0's, so node 1 is the last at torch's exit barrier, in node 0's
    store: node 0 must keep that store up until node 1 has passed the barrier and closed the rendezvous
    (shoal/launch/node_exit.py). Both exit 0 and print nothing but the line that says what they do. The second
    job starts on the port the first has just left, its connections still in TIME_WAIT on node 0."""
    master = f"{cluster.nodes[0].addr}:{PORT + 3}"
    with cluster.slowed(cluster.nodes[1], "64kbit"):  # node 1's store calls take ~0.1 s: the slow one to leave
        procs = [cluster.popen(cluster.nodes[k], [sys.executable, "-c", NODE, str(k), master, rdzv], {}, cwd=REPO,
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in (1, 0)]
        outs = [p.communicate(timeout=120) for p in procs]
    for (out, err), p, k in zip(outs, procs, (1, 0)):
        assert p.returncode == 0 and out == "", (k, out, err)
        # the namespaces have no name server: torch's store says so once for each node that connects
        lines = [line for line in err.strip().splitlines() if "client socket cannot be retrieved" not in line]
        assert lines == [f"shoal: node {k} of 2 ({cluster.nodes[k].addr} on {cluster.nodes[k].ifname}) "
                         f"{'joins' if k else 'hosts'} the rendezvous at {master}"], (k, err)


def test_bad_multinode_input_is_one_line_before_any_worker(cluster, tmp_path):
    """Inside a node: an interface that does not exist, and a master nobody listens at."""
    a, b = cluster.nodes
    for node, flags, words in [
        (a, ["--node-rank", "0", "--master", f"{a.addr}:{PORT + 2}", "--ifname", "eth9"], "no such interface"),
        (b, ["--node-rank", "1", "--master", f"{a.addr}:{PORT + 2}", "--rdzv-timeout", "2"], "no rendezvous at"),
        (b, ["--node-rank", "1", "--master", "10.99.0.1"], "no route"),
    ]:
        argv = [sys.executable, "-m", "shoal", "train", "--nnodes", "2", "--nproc", "2", "--out", str(tmp_path / "x"),
                "--set", "model.preset=debug", *flags]
        r = cluster.popen(node, argv, {}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        out, err = r.communicate(timeout=60)
        assert r.returncode == 2 and words in err and len(err.strip().splitlines()) == 1, (flags, out, err)
        assert not (tmp_path / "x").exists()
