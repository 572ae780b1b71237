"""A run directory that is not the same directory on both nodes is refused before training starts,
and `shoal doctor --nnodes 2` says so beside each node's network checks and busbw per tier.

Node b runs in its own mount namespace with a tmpfs over the run directory: the same path, another
filesystem, as a node-local disk would be. (The shared case runs in test_two_nodes.py, whose
two-node `shoal train` saves a checkpoint after passing the same probe.)
"""

import json
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.timeout(300)


def on_both_nodes(cluster, command: list[str], port: int, local: str) -> dict[int, tuple[int, str, str]]:
    """`shoal COMMAND --nnodes 2 --node-rank K --master A:PORT --nproc 2` on both nodes, with `local`
    a node-local tmpfs on node b; node -> (exit code, stdout, stderr)."""
    procs = {}
    for k in (1, 0):  # node 1 first: it waits for node 0's rendezvous
        argv = [sys.executable, "-m", "shoal", command[0], "--nnodes", "2", "--node-rank", str(k), "--master",
                f"{cluster.nodes[0].addr}:{port}", "--nproc", "2", *command[1:]]
        procs[k] = cluster.popen(cluster.nodes[k], argv, {"COLUMNS": "250"}, local_dir=local if k else None,
                                 cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outputs = {k: p.communicate(timeout=240) for k, p in procs.items()}
    return {k: (procs[k].returncode, *outputs[k]) for k in procs}


def consoles(results: dict[int, tuple[int, str, str]]) -> str:
    """Each node's exit code and whole console, for a failure message pytest does not shorten."""
    return "\n".join(f"--- node {k}: exit {code}\n{out}{err}" for k, (code, out, err) in results.items())


def the_error(command: str, stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith(f"shoal {command}: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_training_refuses_a_run_directory_that_only_one_node_sees(cluster, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    results = on_both_nodes(cluster, ["train", "--out", str(run), "--quiet", "--set", "model.preset=debug",
                                      "--set", "train.steps=2", "--set", "train.seq_len=32",
                                      "--set", "checkpoint.every=1"], 32010, str(run))
    assert [code for code, _, _ in results.values()] == [2, 2], consoles(results)
    for k, (_, _, stderr) in results.items():  # one line on each node's console: the directory, the nodes, the fix
        line = the_error("train", stderr)
        assert f"--out='{run}/checkpoints': is not one directory for all nodes" in line, line
        assert "node 0" in line and "node 1" in line and "filesystem every node mounts" in line, line
    # nothing trained, no probe left behind on node a
    assert not (run / "metrics.jsonl").exists() and list((run / "checkpoints").iterdir()) == []


def test_doctor_checks_each_node_measures_both_tiers_and_refuses_a_node_local_out(cluster, tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    results = on_both_nodes(cluster, ["doctor", "--out", str(out), "--max-size", "2M", "--budget", "0.2", "--json"],
                            32020, str(out))
    assert [code for code, _, _ in results.values()] == [2, 2], consoles(results)
    for k, (_, stdout, stderr) in results.items():
        node, report = cluster.nodes[k], json.loads(stdout)
        checks = {c["name"]: c for c in report["checks"]}
        assert report["node_rank"] == k and not report["ok"], stdout
        assert checks["interface"]["detail"] == f"{node.ifname} ({node.addr}) routes to the master", stdout
        assert ("is free to bind here" if k == 0 else "answers from node 0") in checks["rendezvous"]["detail"], stdout
        assert checks["shared --out"]["verdict"] == "fail" and {"all_reduce inside", "all_reduce across"} <= set(checks)
        # the across group really crossed the shaped veth: 400 Mbit/s bounds its busbw (2 ranks: = algbw)
        across = float(checks["all_reduce across"]["detail"].split("busbw ")[1].split(" GB/s")[0])
        assert 0 < across <= 0.055, checks["all_reduce across"]
        assert f"--out='{out}': is not one directory for all nodes" in the_error("doctor", stderr)
        assert report["not_shared"] in the_error("doctor", stderr)
