"""The side channel once the store's host has gone (rank 0 or the agent left first): the goodbye gives
up in seconds instead of retrying its connect for the whole store timeout (without `hurry`, one
`shoal train --nproc 4` run in three hung at exit for the 100 s it was given), and a thread's first
call fails at once on the refused port (the survivor of a killed rank 0 sat 16 s in it)."""

import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from shoal.debug.channel import Channel

pytestmark = pytest.mark.timeout(60)


def test_a_hurried_channel_gives_up_quickly_once_the_store_is_gone():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    channel = Channel(client, "shoal", timeout_s=30.0)
    channel.set("alive", "1")  # this thread's connection works while the host is up
    assert server.get("shoal/alive") == b"1"
    del server  # the host leaves
    channel._local = type(channel._local)()  # a thread that has not connected yet (the exit path's case)
    channel.hurry(1.0)
    started = time.monotonic()
    try:  # its new connection fails after 1 s (it may then write to the old, dead one)
        channel.set("bye", "1")
    except Exception:
        pass
    assert time.monotonic() - started < 10  # without hurry: the 30 s store timeout


def test_a_first_connection_to_a_store_that_is_gone_fails_at_once():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
    channel = Channel(client, "shoal", timeout_s=30.0)
    del server  # the host leaves before this thread has a connection of its own (an incident's first call)
    started = time.monotonic()
    with pytest.raises(dist.DistNetworkError, match="nothing accepts connections"):
        channel.present(["incident"])
    assert time.monotonic() - started < 10  # torch's client retries a refused connect for the 30 s store timeout
