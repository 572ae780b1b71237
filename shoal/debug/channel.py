"""The side channel: keys in the job's c10d store, reached over connections of our own.

Fingerprints and progress records travel through the same TCPStore the process group was
rendezvoused with, never through the process group itself, so a mismatched or missing
collective cannot block the exchange that diagnoses it. Each thread gets its own clone of the
store (its own socket and timeout), so the checker on the main thread, the watchdog thread and
the janitor never wait on each other.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from datetime import timedelta

import torch.distributed as dist


class Channel:
    """`shoal/debug/<generation>/...` keys in the default group's store."""

    def __init__(self, store: dist.Store, prefix: str, timeout_s: float):
        self._base = dist.PrefixStore(prefix, store)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._trash: deque[str] = deque()
        self._janitor: threading.Thread | None = None
        self._closed = threading.Event()

    def client(self) -> dist.Store:
        """This thread's connection; gets and waits on it time out after `timeout_s`."""
        loc = self._local
        c = getattr(loc, "store", None)
        if c is None:
            # clone() connects with TCPStore's own retry loop, which waits out the store's whole timeout on a
            # refused port: the first thread to need the channel after the store's host died (an incident's, on
            # the survivor of a killed rank 0) sat there until the watchdog gave up on it, 16 s
            if isinstance(self._connect_error(), ConnectionRefusedError):  # refused, not slow: nothing listens
                raise dist.DistNetworkError("nothing accepts connections at its address any more")
            try:
                c, loc.shared = self._base.clone(), False
            except (RuntimeError, AttributeError):  # a store that cannot clone: share it, keep its timeout
                c, loc.shared = self._base, True
            loc.store, loc.timeout_s = c, None
        if not loc.shared and loc.timeout_s != self.timeout_s:
            c.set_timeout(timedelta(seconds=self.timeout_s))
            loc.timeout_s = self.timeout_s
        return c

    def new_client(self) -> dist.Store:
        """A connection of its own, for an owner outside our threads (the checker's gloo group)."""
        try:
            c = self._base.clone()
            c.set_timeout(timedelta(seconds=self.timeout_s))
            return c
        except (RuntimeError, AttributeError):
            return self._base

    def set(self, key: str, value: str) -> None:
        self.client().set(key, value)  # TCPStore sets do not wait for a reply

    def get_all(self, keys: list[str], timeout_s: float | None = None) -> list[bytes] | None:
        """Values of all keys, waiting until each exists; None if some do not appear in time."""
        c = self.client()
        try:
            if timeout_s is not None:
                c.wait(keys, timedelta(seconds=timeout_s))
            return c.multi_get(keys)
        except dist.DistStoreError:
            return None

    def present(self, keys: list[str]) -> list[bool]:
        c = self.client()
        return [c.check([k]) for k in keys]

    def claim(self, key: str, value: str) -> str:
        """Set `key` if nobody has; returns the value that won (ours or the earlier one)."""
        return self.client().compare_set(key, "", value).decode()

    def discard(self, keys: list[str]) -> None:
        """Delete keys soon, off the caller's thread (a delete is a round trip)."""
        self._trash.extend(keys)
        if self._janitor is None:
            self._janitor = threading.Thread(target=self._sweep, name="shoal-debug-janitor", daemon=True)
            self._janitor.start()

    def _sweep(self) -> None:
        while not self._closed.wait(0.5):
            try:
                c = self.client()
                while self._trash:
                    c.delete_key(self._trash.popleft())
            except Exception:  # the store went away with the job; nothing left to clean
                return

    def hurry(self, timeout_s: float) -> None:
        """Every call from now on, a new connection's connect included, gives up after timeout_s.
        For a process on its way out: the store's host (the agent, or rank 0) may be gone already,
        and a connect to it retries for the whole store timeout, which can be the job's."""
        self.timeout_s = min(self.timeout_s, timeout_s)
        self._base.set_timeout(timedelta(seconds=self.timeout_s))  # what clone() connects with

    def reachable(self) -> bool:
        """Whether the store's server still accepts connections, asked with a plain socket: when its
        host (rank 0, or the agent) is gone, torch's client logs every failed connect as an error
        with a C++ stack, which a rank leaving after an error it has already explained should not add."""
        return self._connect_error() is None

    def _connect_error(self) -> OSError | None:
        """Why a plain connect to the store's server fails (None when it succeeds, or the store is no TCPStore)."""
        store = self._base
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        if not isinstance(store, dist.TCPStore):
            return None
        try:
            socket.create_connection((store.host, store.port), timeout=1.0).close()
            return None
        except OSError as e:
            return e

    def close(self) -> None:
        self._closed.set()
        if self._janitor is not None and self._janitor is not threading.current_thread():
            self._janitor.join(timeout=1.0)
