"""One node of a multi-node job: what `torchrun --nnodes N` needs, worked out and checked up front.

`shoal train --nnodes N --node-rank K --master HOST[:PORT] --nproc P` runs the elastic agent (the
machinery behind torchrun) with c10d rendezvous hosted on node 0 at HOST:PORT. Each setting below
was needed by hand on a real two-node run (docs/cluster.md), so shoal sets it:

- GLOO_SOCKET_IFNAME = the interface that routes to the master. Unset, gloo binds 127.0.0.1: the
  other node's connections fail after ~25 s while this node hangs.
- local_addr = this node's address on that interface. Unset, the agent advertises
  socket.getfqdn() (often `localhost`) and workers hang in init_process_group.
- is_host = whether this machine owns the master address. torch guesses it by comparing the
  endpoint with the hostname's addresses, which fails when the endpoint is an IP.
- TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (set by shoal.launch.local for every launch): restarts on
  gloo otherwise read the dead attempt's rank addresses (pytorch#135712).
- At the end, node 0 keeps its store up until the other nodes have left it (shoal/launch/node_exit.py).
  Otherwise a node still in torch's exit barrier prints stacks after a job that succeeded (pytorch#69520).

Node order: c10d rendezvous numbers nodes by sorting the agents' addresses, not by --node-rank;
each node still gets one contiguous block of ranks, so groups inside a node stay inside a node.
--node-rank says which node hosts the rendezvous (0: the one at --master) and is checked against it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import struct
import time
from dataclasses import dataclass

from shoal.errors import UserError

DEFAULT_PORT = 29500  # torchrun's


@dataclass(frozen=True)
class NodePlan:
    nnodes: int
    node_rank: int
    master_ip: str
    port: int
    ifname: str
    local_addr: str
    is_host: bool
    timeout: int
    rdzv: str = "c10d"

    def launch_config(self) -> dict:
        """Fields of torch's LaunchConfig for this node (shoal.launch.local.launch(nodes=...))."""
        conf = {"rank": self.node_rank, "timeout": self.timeout} if self.rdzv == "static" else \
            {"join_timeout": self.timeout, "is_host": self.is_host}
        return dict(min_nodes=self.nnodes, max_nodes=self.nnodes, rdzv_endpoint=f"{self.master_ip}:{self.port}",
                    rdzv_backend=self.rdzv, rdzv_configs=conf, local_addr=self.local_addr,
                    run_id=f"shoal-{self.master_ip}-{self.port}")  # the same on every node without coordination

    def env(self) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": self.ifname}

    def describe(self) -> str:
        role = "hosts the rendezvous" if self.is_host else "joins the rendezvous"
        return (f"shoal: node {self.node_rank} of {self.nnodes} ({self.local_addr} on {self.ifname}) {role} at "
                f"{self.master_ip}:{self.port}")


def multinode(nnodes: int, node_rank: int, master: str, ifname: str = "", timeout: int = 120,
              rdzv: str = "c10d") -> bool:
    """Whether the flags ask for a multi-node job. --node-rank alone is refused: that node of a job
    whose --nnodes was left out would run on its own; --ifname and --rdzv static alone too: one machine's
    ranks talk over loopback and need no rendezvous across nodes, so they would be ignored. A --rdzv-timeout
    no wait can have (0, negative, years) is refused on one machine too, where it goes unused: a typo either
    way, said before anything runs."""
    check_rdzv_timeout(timeout)
    if nnodes == 1 and not master:
        for flag, value in (("--node-rank", node_rank), ("--ifname", ifname),
                            ("--rdzv", rdzv if rdzv != "c10d" else "")):
            if value:
                raise UserError(flag, value, "is for a multi-node job; give --nnodes and --master too, "
                                             "or drop it on one machine")
        return False
    return True


def check_world(nnodes: int, per_node: int) -> None:
    """--nnodes times the ranks a node starts is the world: past MAX_GPUS it is a typo, said in the flag typed
    (job.resolve's own bound speaks of the world size, which nobody types here)."""
    from shoal.layout import MAX_GPUS

    if nnodes * per_node > MAX_GPUS:
        raise UserError("--nnodes", nnodes, f"x {per_node} ranks a node is {nnodes * per_node:,} ranks, more than "
                                            f"{MAX_GPUS:,} (a typo?)")


MAX_RDZV_TIMEOUT_S = 7 * 24 * 3600
"""The longest wait for the other nodes: past a week it is a typo."""


def check_rdzv_timeout(timeout: int) -> None:
    if not 1 <= timeout <= MAX_RDZV_TIMEOUT_S:  # far larger overflowed torch's timedelta: a traceback
        raise UserError("--rdzv-timeout", timeout, f"must be a number of seconds from 1 to {MAX_RDZV_TIMEOUT_S} "
                                                   "(a week), e.g. 120")


def plan_node(nnodes: int, node_rank: int, master: str, ifname: str = "", timeout: int = 120,
              rdzv: str = "c10d") -> NodePlan:
    """Check this node's flags and network, and work out its settings; raises UserError on the first problem."""
    if nnodes < 1:
        raise UserError("--nnodes", nnodes, "must be a positive integer")
    if not 0 <= node_rank < nnodes:
        raise UserError("--node-rank", node_rank, f"must be in 0..{nnodes - 1} for --nnodes {nnodes}")
    check_rdzv_timeout(timeout)
    if not master:
        raise UserError("--master", master, "give node 0's address as HOST[:PORT] (the same on every node)")
    host, port = _split(master)
    ip = _resolve(host, master)
    local = _source_addr(ip, port, master)
    if nnodes > 1 and (local.startswith("127.") or ip.startswith("127.")):
        raise UserError("--master", master, "is a loopback address the other nodes cannot reach; give node 0's "
                                            "address on the network that joins the nodes")
    addrs = interface_addrs()
    field = "--ifname" if ifname else "GLOO_SOCKET_IFNAME"  # a choice already in the environment counts too
    ifname = ifname or os.environ.get("GLOO_SOCKET_IFNAME", "")
    if ifname:
        if ifname not in addrs:
            raise UserError(field, ifname, f"no such interface with an IPv4 address here; this machine has: "
                                                f"{_list(addrs)}")
        local = addrs[ifname]
    else:
        found = [name for name, a in addrs.items() if a == local] or list(filter(None, [_interface_of(local)]))
        if not found:
            raise UserError("--master", master, f"cannot tell which interface reaches {ip} (from {local}); "
                                                f"pass --ifname, one of: {_list(addrs)}")
        ifname = found[0]
    is_host = _is_local(ip)
    if is_host != (node_rank == 0):
        fix = (f"node 0 hosts the rendezvous, so --master must be an address of node 0 (this machine has "
               f"{_list(addrs)})" if node_rank == 0 else
               f"{ip} is this machine's own address: run this machine as --node-rank 0, the others as 1..{nnodes - 1}")
        raise UserError("--node-rank" if node_rank else "--master", node_rank if node_rank else master, fix)
    if is_host:
        _check_port_free(ip, port, master)
    else:
        _wait_for_master(ip, port, master, timeout)
    return NodePlan(nnodes, node_rank, ip, port, ifname, local, is_host, timeout, rdzv)


def _split(master: str) -> tuple[str, int]:
    if master.count(":") > 1:  # split at its last colon, fd00::2 was read as host 'fd00:' and port 2
        raise UserError("--master", master, "is an IPv6 address; the launcher rendezvouses over IPv4: give node 0's "
                                            "IPv4 address or a host name, e.g. 10.0.0.1:29500")
    host, colon, port = master.rpartition(":") if ":" in master else (master, "", str(DEFAULT_PORT))
    if not colon:
        host = master
    try:
        n = int(port)
    except ValueError:
        n = -1
    if not host or not 1 <= n <= 65535:
        raise UserError("--master", master, "write HOST or HOST:PORT with a port in 1..65535, e.g. 10.0.0.1:29500")
    return host, n


def _resolve(host: str, master: str) -> str:
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError):
        raise UserError("--master", master, f"cannot resolve {host!r} to an IPv4 address here; check the name "
                                            f"or give node 0's IP address") from None


def _source_addr(ip: str, port: int, master: str) -> str:
    """This machine's address on the route to ip (a UDP connect sends nothing; the kernel picks the route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((ip, port))
        except OSError as e:
            raise UserError("--master", master, f"no route from this machine to {ip} ({e.strerror}); check the "
                                                f"address and this node's network") from None
        return s.getsockname()[0]


def interface_addrs() -> dict[str, str]:
    """Interface name -> its IPv4 address, for the interfaces that have one (Linux)."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's (first) IPv4 address
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            out[name] = socket.inet_ntoa(raw[20:24])
    return out


def _interface_of(addr: str) -> str:
    """The interface holding addr, secondary addresses included (`ip -o -4 addr`; '' if unknown)."""
    import subprocess

    try:
        text = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in text.splitlines():  # "3: eth0    inet 10.0.0.2/24 brd ... scope global eth0"
        parts = line.split()
        if len(parts) > 3 and parts[2] == "inet" and parts[3].split("/")[0] == addr:
            return parts[1]
    return ""


def _bind_error(ip: str, port: int = 0) -> OSError | None:
    """Why this machine cannot bind ip:port, or None when it can. With SO_REUSEADDR, as torch's TCPStore binds
    its port: the last job's connections in TIME_WAIT (60 s after node 0, which closes them, exits) do not
    keep the next job off the port, a process listening there does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError as e:
            return e
    return None


def _is_local(ip: str) -> bool:
    """Whether ip is one of this machine's addresses (only those can be bound), secondary ones included."""
    return _bind_error(ip) is None


def _list(addrs: dict[str, str]) -> str:
    return ", ".join(f"{n} ({a})" for n, a in addrs.items()) or "none"


def _check_port_free(ip: str, port: int, master: str) -> None:
    if (e := _bind_error(ip, port)) is not None:
        raise UserError("--master", master, f"port {port} is not free on this machine ({e.strerror}); "
                                            f"choose another port on every node")


def _wait_for_master(ip: str, port: int, master: str, timeout: int) -> None:
    """Until node 0's rendezvous store answers: "refused" means node 0 has not started yet (wait),
    "unreachable" means it never will from here (stop now), and something that accepts the
    connection but does not speak the store's protocol is another service on that port."""
    deadline, last = time.monotonic() + timeout, ""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(min(5.0, timeout))
            try:
                s.connect((ip, port))
                if _is_store(ip, port):
                    return
                last = "something answers there but it is not a torch rendezvous store; "
            except OSError as e:
                if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                    raise UserError("--master", master, f"{ip} is unreachable from this node ({e.strerror}); "
                                                        f"check the address and the network") from None
                last = f"{e.strerror or e}; "
        if time.monotonic() >= deadline:
            raise UserError("--master", master, f"no rendezvous at {ip}:{port} after {timeout} s ({last}start "
                                                f"node 0 first with --node-rank 0, or check the address and port)")
        time.sleep(1.0)


def _is_store(ip: str, port: int) -> bool:
    """Whether a torch TCPStore answers at ip:port (its client logs each failed try with a C++ stack
    on stderr: hidden here, the caller says it in one line)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            TCPStore(ip, port, is_master=False, timeout=timedelta(seconds=3), wait_for_workers=False)
        return True
    except (RuntimeError, ValueError):  # DistNetworkError/DistStoreError are RuntimeErrors
        return False
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def launch_nodes(argv: list[str], nproc: int, plan: NodePlan, max_restarts: int = 0,
                 said_why: tuple[int, ...] = (), on_sigterm=None) -> int:
    """shoal.launch.local.launch for one node of a multi-node job."""
    from torch.distributed.elastic.rendezvous import RendezvousError

    from shoal.launch.local import launch
    from shoal.launch.node_exit import store_kept_until_every_node_left

    try:
        with store_kept_until_every_node_left(plan.nnodes, plan.is_host):
            return launch(argv, nproc, max_restarts=max_restarts, said_why=said_why, nodes=apply(plan),
                          on_sigterm=on_sigterm)
    except RendezvousError as e:  # the nodes never met: nothing trained
        why = type(e).__name__ + (f": {str(e).splitlines()[0]}" if str(e).strip() else "")
        raise UserError("--master", f"{plan.master_ip}:{plan.port}",
                        f"the {plan.nnodes} nodes did not all join ({why}); start every node within "
                        f"--rdzv-timeout={plan.timeout} s with the same --master and --nnodes") from None


def apply(plan: NodePlan) -> dict:
    """Say what this node does, set the workers' environment; returns the LaunchConfig fields."""
    import sys

    print(plan.describe(), file=sys.stderr, flush=True)
    os.environ.update(plan.env())  # the agent passes its environment to the workers
    return plan.launch_config()
