"""A rank whose process is gone is not waited for: not by the hang report's reporter collecting stacks, nor by
rank 0 waiting for the others' goodbyes before it takes the store away. Both waited out their whole timeout for a
rank the kernel had already reaped (6 s and 2 s after every killed worker, before its launcher could say which)."""

import json
import os
import socket
import subprocess
import time

import pytest

import shoal.debug
from shoal.debug import records
from shoal.debug.incident import Incident

pytestmark = pytest.mark.timeout(60)
LONG = 30.0  # the waits under test, lengthened: a test that waits them out cannot pass


class Store:
    """The side channel's calls these waits make, on a dict."""

    def __init__(self, values: dict[str, str]):
        self.values = values

    def present(self, keys):
        return [k in self.values for k in keys]

    def get_all(self, keys, timeout_s=None):
        return [self.values[k].encode() for k in keys] if all(k in self.values for k in keys) else None


def record(rank: int, pid: int) -> str:
    return json.dumps({"rank": rank, "host": socket.gethostname(), "pid": pid, "step": 3, "hb": time.time()})


@pytest.fixture
def two_ranks_one_dead():
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid is gone
    return Store({records.key(0): record(0, os.getpid()), records.key(1): record(1, dead.pid),
                  "dump/0": json.dumps({"stacks": []})})


def test_the_reporter_does_not_wait_for_a_dead_ranks_stacks(two_ranks_one_dead):
    started = time.monotonic()
    dumps = Incident(monitor=None, grace_s=LONG)._collect(two_ranks_one_dead, 2)
    assert list(dumps) == [0] and time.monotonic() - started < LONG / 3


def test_rank_0_does_not_wait_for_a_dead_ranks_goodbye(two_ranks_one_dead, monkeypatch):
    monkeypatch.setattr(shoal.debug, "GOODBYE_TIMEOUT_S", LONG)
    started = time.monotonic()
    shoal.debug._wait_for_goodbyes(two_ranks_one_dead, 2)
    assert time.monotonic() - started < LONG / 3
    alive = Store({**two_ranks_one_dead.values, records.key(1): record(1, os.getpid())})  # rank 1 still running
    monkeypatch.setattr(shoal.debug, "GOODBYE_TIMEOUT_S", 1.0)
    started = time.monotonic()
    shoal.debug._wait_for_goodbyes(alive, 2)
    assert time.monotonic() - started >= 1.0  # a live rank is waited for, up to the timeout
