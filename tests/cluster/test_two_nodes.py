"""Two nodes x two ranks under real `torchrun --nnodes 2` train like one process."""

import json
import subprocess
import time

import pytest

pytestmark = pytest.mark.timeout(300)

PORT = 29780  # rendezvous on node a (the shc* namespaces have their own port space; this is ours by convention)
STEPS = 3
# One layout per kind of group that crosses the node boundary: the DP group (FSDP over 4 ranks),
# DP across with TP inside each node, PP across with TP inside.
LAYOUTS = ["dp_shard=4,zero=3", "tp=2,dp_shard=2", "tp=2,pp=2,dp_shard=1"]


def test_verify_layouts_on_two_nodes_match_one_process(cluster, tmp_path):
    import torch

    from shoal.train.trainer import train
    from shoal.train.verify import compare, config_for

    torch.set_num_threads(1)  # the workers' thread count: sums split the same way
    train(config_for("dp_shard=1", 1, STEPS, global_batch=16), tmp_path / "reference", show=False)
    t0 = time.time()
    argv = ["-m", "shoal.train.verify", str(tmp_path), "4", str(STEPS), json.dumps(LAYOUTS)]
    procs = [cluster.torchrun(k, 2, PORT, f"parity-{t0:.0f}", argv, stdout=(tmp_path / f"node{k}.log").open("w"),
                              stderr=subprocess.STDOUT) for k in range(2)]
    codes = [p.wait(timeout=240) for p in procs]
    logs = "\n".join((tmp_path / f"node{k}.log").read_text()[-3000:] for k in range(2))
    assert codes == [0, 0], logs
    results = [compare(layout, tmp_path / f"layout{i}", tmp_path / "reference", 1e-4) for i, layout in enumerate(LAYOUTS)]
    print(f"2 nodes x 2 ranks, {len(LAYOUTS)} layouts x {STEPS} steps: {time.time() - t0:.1f} s")
    for r in results:
        print(f"{r.layout:28s} loss {r.loss_diff:.1e} grad {r.grad_diff:.1e} weights {r.weight_diff:.1e}")
    assert all(r.passed for r in results), [(r.layout, r.loss_diff, r.grad_diff, r.weight_diff) for r in results]
