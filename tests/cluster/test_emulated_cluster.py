"""The emulated cluster cleans up after a session that was killed before its teardown."""

from __future__ import annotations

import os
import subprocess

import pytest

from shoal.testing.emulated_cluster import cannot_make_namespaces, sweep_stale


def _namespaces() -> list[str]:
    return [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                       text=True).stdout.splitlines() if line.strip()]


def test_a_killed_sessions_namespaces_are_swept_and_a_live_ones_kept():
    why = cannot_make_namespaces()
    if why:
        pytest.skip(f"no emulated cluster: {why}")
    live = {int(p) % 1000000 for p in os.listdir("/proc") if p.isdigit()}
    dead = f"shc{next(n for n in range(999999, 0, -1) if n not in live)}a"  # what SIGKILL left behind
    mine = f"shc{os.getpid() % 1000000}p"  # a running session's (a and b may be this session's cluster)
    try:
        for ns in (dead, mine):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        assert dead in sweep_stale()
        assert dead not in _namespaces() and mine in _namespaces()
    finally:
        for ns in (dead, mine):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
