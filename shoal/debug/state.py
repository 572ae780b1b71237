"""What this rank is doing right now: step, phase, the collective in flight and the last few.

Everything here is plain attribute writes on one object so the hot path (every collective, every
`progress()` call) costs well under a microsecond. Nothing here talks to other ranks: the watchdog
thread copies a snapshot into the store about once a second.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque

from shoal.worker import exit_codes

RECENT = 16  # collectives remembered per rank for reports
HANG_EXIT_CODE = exit_codes.HANG  # a rank's exit code after a hang report


class CollectiveRecord:
    """One collective or point-to-point call as this rank issued it."""

    __slots__ = ("op", "api", "group", "seq", "site", "via", "peer", "shapes", "t_start", "status")

    def __init__(self, op: str, api: str, group: str, seq: int, site: str | None, via: str | None,
                 peer: int | None = None, shapes: str = ""):
        self.op, self.api, self.group, self.seq = op, api, group, seq
        self.site, self.via, self.peer, self.shapes = site, via, peer, shapes
        self.t_start = time.time()
        self.status = "issuing"  # issuing -> checking -> issued -> waiting -> done | failed

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class RankState:
    """This process's progress; one instance per process (`STATE`)."""

    def __init__(self):
        self.rank: int | None = None
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.step = -1
        self.phase = ""
        self.progress_n = 0
        self.progress_t = time.time()
        self.inflight: CollectiveRecord | None = None  # issued and not yet waited, or being checked
        self.recent: deque[CollectiveRecord] = deque(maxlen=RECENT)
        self.seqs: dict[str, int] = {}  # collectives entered per group name
        self.groups: dict[str, str] = {}  # group name -> its ranks as "0-3,8" (for "waiting for whom")
        self.exit: str | None = None  # "ok" / "error: ..." once the process is leaving

    def progress(self) -> None:
        self.progress_n += 1
        self.progress_t = time.time()

    def snapshot(self) -> dict:
        """A JSON-able copy for other ranks; read without locks (a torn read costs one stale field)."""
        inflight = self.inflight
        return {
            "rank": self.rank, "host": self.host, "pid": self.pid, "step": self.step, "phase": self.phase,
            "progress_n": self.progress_n, "progress_t": self.progress_t, "hb": time.time(),
            "inflight": inflight.to_dict() if inflight is not None else None,
            "recent": [r.to_dict() for r in list(self.recent)[-8:]],
            "seqs": dict(self.seqs), "groups": dict(self.groups), "exit": self.exit,
        }

    def pulse(self) -> str:
        """The few numbers a stalled rank reads from every other rank each second: small on purpose."""
        inflight = self.inflight
        checking = inflight.t_start if inflight is not None and inflight.status == "checking" else 0.0
        return f"{time.time():.3f} {self.progress_t:.3f} {checking:.3f} {int(self.exit is not None)}"


STATE = RankState()
# A worker forked from a process that imported this module (shoal/launch/forked.py) starts its own record.
os.register_at_fork(after_in_child=STATE.__init__)
