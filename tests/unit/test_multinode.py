"""`shoal train --nnodes`: every bad flag is refused in-process, before any network wait or worker."""

import pytest

from shoal.errors import UserError
from shoal.launch.multinode import interface_addrs, multinode, plan_node


@pytest.mark.parametrize("kwargs,field,words", [
    (dict(nnodes=0, node_rank=0, master="h"), "--nnodes", "positive"),
    (dict(nnodes=2, node_rank=2, master="h"), "--node-rank", "0..1"),
    (dict(nnodes=2, node_rank=0, master=""), "--master", "HOST[:PORT]"),
    (dict(nnodes=2, node_rank=0, master="h:0"), "--master", "1..65535"),
    (dict(nnodes=2, node_rank=0, master="h:port"), "--master", "1..65535"),
    (dict(nnodes=2, node_rank=0, master="no-such-host.invalid"), "--master", "cannot resolve"),
    (dict(nnodes=2, node_rank=0, master="fd00::2"), "--master", "IPv6"),  # was "cannot resolve 'fd00:'"
    (dict(nnodes=2, node_rank=0, master="127.0.0.1:29790"), "--master", "loopback"),
    (dict(nnodes=2, node_rank=0, master="localhost"), "--master", "loopback"),
    (dict(nnodes=2, node_rank=0, master="h", timeout=0), "--rdzv-timeout", "from 1"),
    (dict(nnodes=2, node_rank=0, master="h", timeout=10**20), "--rdzv-timeout", "a week"),  # OverflowError in torch
])
def test_bad_flags(kwargs, field, words):
    with pytest.raises(UserError) as e:
        plan_node(**kwargs)
    assert e.value.field == field and words in e.value.fix, e.value


@pytest.mark.parametrize("kwargs,field", [(dict(node_rank=1), "--node-rank"), (dict(ifname="eth9"), "--ifname"),
                                          (dict(rdzv="static"), "--rdzv")])
def test_a_node_flag_on_one_machine_is_refused(kwargs, field):
    """`--rdzv static` without --nnodes/--master was ignored silently (shoal doctor --checks-only, shoal train)."""
    with pytest.raises(UserError) as e:
        multinode(**{"nnodes": 1, "node_rank": 0, "master": "", **kwargs})
    assert e.value.field == field and "multi-node" in e.value.fix
    assert multinode(1, 0, "", rdzv="c10d") is False


def _own_address():
    addrs = {n: a for n, a in interface_addrs().items() if not a.startswith("127.")}
    if not addrs:
        pytest.skip("this machine has no non-loopback IPv4 address")
    return next(iter(addrs.items()))


def test_node_zero_hosts_at_its_own_address():
    ifname, addr = _own_address()
    plan = plan_node(2, 0, f"{addr}:29791")
    assert (plan.ifname, plan.local_addr, plan.is_host) == (ifname, addr, True)
    cfg = plan.launch_config()
    assert cfg["rdzv_configs"]["is_host"] is True and cfg["local_addr"] == addr and cfg["min_nodes"] == 2
    assert plan.env() == {"GLOO_SOCKET_IFNAME": ifname}


def test_the_port_of_a_job_that_just_ended_is_free_and_a_listened_one_is_not():
    """Node 0's store closes its connections when the job ends, which leaves them in TIME_WAIT on its port for
    a minute; the next job binds the port as the store does (SO_REUSEADDR), so it is not refused."""
    import socket

    _, addr = _own_address()
    with socket.create_server((addr, 0), reuse_port=False) as server:
        port = server.getsockname()[1]
        with socket.create_connection((addr, port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server's side closes first: its end, on `port`, waits in TIME_WAIT
            client.recv(1)
        with pytest.raises(UserError, match="not free"):  # still listened on
            plan_node(2, 0, f"{addr}:{port}")
    assert plan_node(2, 0, f"{addr}:{port}").is_host


def test_node_rank_must_match_who_owns_the_master():
    _, addr = _own_address()
    with pytest.raises(UserError, match="run this machine as --node-rank 0"):
        plan_node(2, 1, addr)


def test_missing_interface(monkeypatch):
    _, addr = _own_address()
    with pytest.raises(UserError, match="no such interface") as e:
        plan_node(2, 0, addr, ifname="nosuch0")
    assert e.value.field == "--ifname"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuch1")  # a stale setting in the environment is named as such
    with pytest.raises(UserError) as e:
        plan_node(2, 0, addr)
    assert e.value.field == "GLOO_SOCKET_IFNAME"
