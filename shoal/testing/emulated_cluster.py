"""An emulated two-node cluster on one machine: two network namespaces joined by a shaped veth.

Used by the cluster tests (tests/cluster/conftest.py) and the benchmarks that need two nodes; needs
root and iproute2 (`cannot_make_namespaces` says why not).

Each namespace is a "node" with its own interface and address. Traffic between ranks of one node
is delivered locally inside the namespace (unshaped); traffic between nodes crosses the veth pair,
shaped with `tc tbf` to 400 Mbit/s each way. On these machines that measured ~500 MB/s inside a
node and ~25 MB/s across (16 MB all_reduce): the ~20x tier ratio of NVLink vs one NIC per GPU.
Recipe and measurements: docs/cluster.md.

Everything the fixture makes is named `shc<pid><a|b>` (namespaces and veths; shc = shoal cluster)
and lives on its own /24, so parallel test sessions do not collide; teardown (also after a failure)
kills the processes it started by process group, then whatever else still runs in the namespaces by
pid, then deletes the namespaces by name (which deletes the veth pair with them). A session killed
before its teardown leaves them behind: the next cluster deletes those first (`sweep_stale`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from collections.abc import Iterator
from dataclasses import dataclass, field

RATE = "400mbit"  # the inter-node link; intra-node traffic never leaves its namespace


@dataclass
class Node:
    netns: str
    ifname: str
    addr: str


@dataclass
class Cluster:
    nodes: list[Node]
    rate: str = RATE  # each node's outgoing link
    procs: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, node: Node, argv: list[str], env: dict[str, str], local_dir: str | None = None,
              **kw) -> subprocess.Popen:
        """Start `argv` inside node's namespace, in a new session so teardown can kill its whole tree.
        local_dir: this process sees a fresh tmpfs there, in its own mount namespace: the same path
        as on the other node, another filesystem (a node-local disk instead of a shared one)."""
        full_env = dict(os.environ, OMP_NUM_THREADS="1", **env)
        if local_dir:
            argv = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs tmpfs "{local_dir}" && exec "$@"', "sh", *argv]
        p = subprocess.Popen(["ip", "netns", "exec", node.netns, *argv], env=full_env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    @contextmanager
    def slowed(self, node: Node, rate: str) -> Iterator[None]:
        """While open, what node sends leaves at `rate` (queued, not dropped: a far, thin link)."""
        _shape("change", node, rate, burst="1600", latency="60s")
        try:
            yield
        finally:
            _shape("change", node, self.rate)

    def torchrun(self, node_rank: int, nproc_per_node: int, port: int, run_id: str, module_argv: list[str],
                 **kw) -> subprocess.Popen:
        """`torchrun --nnodes N` on one node with c10d rendezvous on node 0, plus the settings the
        emulated cluster needs (each explained in docs/cluster.md): the interface gloo binds, the
        address the agent advertises, is_host on the head (the endpoint is an IP), and a fresh
        store per rendezvous round."""
        node, head = self.nodes[node_rank], self.nodes[0]
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(self.nodes)),
                "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{head.addr}:{port}", "--rdzv-id", run_id, "--local-addr", node.addr,
                "--rdzv-conf", f"is_host={int(node_rank == 0)},timeout=120", "--monitor-interval", "0.2",
                *module_argv]
        env = {"GLOO_SOCKET_IFNAME": node.ifname, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        return self.popen(node, argv, env, **kw)


def _shape(verb: str, node: Node, rate: str, burst: str = "256kb", latency: str = "50ms") -> None:
    """What leaves node: at most `rate`, bursts of `burst`, a packet queued `latency` at most (tc's tbf)."""
    _must("ip", "netns", "exec", node.netns, "tc", "qdisc", verb, "dev", node.ifname, "root", "tbf",
          "rate", rate, "burst", burst, "latency", latency)


def _sh(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _kill_tree(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _teardown(names: list[str], cluster: Cluster | None) -> None:
    for p in cluster.procs if cluster else []:
        _kill_tree(p)
    for ns in names:
        # anything still running inside (a worker that left its session), by pid
        for pid in _sh("ip", "netns", "pids", ns).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        if ns in _sh("ip", "netns", "list").stdout.split():
            for _ in range(20):  # a namespace with a dying process in it can refuse deletion briefly
                if _sh("ip", "netns", "del", ns).returncode == 0:
                    break
                time.sleep(0.2)


def sweep_stale() -> list[str]:
    """Delete the namespaces an earlier session left behind when it was killed (SIGKILL and `timeout`
    skip teardown): ours by name (`shc<pid>a|b|p`), with no process inside, made by a process that is
    gone (no live pid has that remainder). Returns their names."""
    live = {int(p) % 1000000 for p in os.listdir("/proc") if p.isdigit()}
    swept = []
    for line in _sh("ip", "netns", "list").stdout.splitlines():
        m = re.match(r"(shc(\d+)[abp])\b", line)
        if m and int(m[2]) not in live and not _sh("ip", "netns", "pids", m[1]).stdout.split():
            if _sh("ip", "netns", "del", m[1]).returncode == 0:
                swept.append(m[1])
    return swept


def _must(*argv: str) -> None:
    r = _sh(*argv)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


def cannot_make_namespaces() -> str:
    """Why this machine cannot build the cluster ('' when it can): tries a throwaway namespace."""
    if not (shutil.which("ip") and shutil.which("tc")):
        return "the `ip` and `tc` commands (iproute2) are not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"shc{os.getpid() % 1000000}p"
    r = _sh("ip", "netns", "add", probe)
    if r.returncode:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _sh("ip", "netns", "del", probe)
    return ""


@contextmanager
def emulated_cluster(rate: str = RATE) -> Iterator[Cluster]:
    """Two nodes, a and b, joined by a veth pair shaped to `rate` each way; torn down on exit."""
    sweep_stale()
    tag = f"shc{os.getpid() % 1000000}"
    subnet = f"10.217.{os.getpid() % 250 + 1}"
    nodes = [Node(f"{tag}a", f"{tag}a", f"{subnet}.1"), Node(f"{tag}b", f"{tag}b", f"{subnet}.2")]
    made = None
    try:
        for n in nodes:
            _must("ip", "netns", "add", n.netns)
        _must("ip", "link", "add", nodes[0].ifname, "type", "veth", "peer", "name", nodes[1].ifname)
        for n in nodes:
            _must("ip", "link", "set", n.ifname, "netns", n.netns)
            _must("ip", "-n", n.netns, "addr", "add", f"{n.addr}/24", "dev", n.ifname)
            _must("ip", "-n", n.netns, "link", "set", "lo", "up")
            _must("ip", "-n", n.netns, "link", "set", n.ifname, "up")
            _shape("add", n, rate)
        made = Cluster(nodes, rate)
        yield made
    finally:
        _teardown([n.netns for n in nodes], made)
