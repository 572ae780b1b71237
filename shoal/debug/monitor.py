"""The hub every intercepted collective passes through: number it, record it, check it.

`shoal.comm.patch` decides *where* calls are caught (`intercept.py` connects it to this hub); this module decides *what happens*: a sequence
number per group (per sender/receiver pair for point-to-point), a `CollectiveRecord` in the
rank's state for the watchdog, the checker's exchange when checking is on, and a report when a
collective fails (a dead peer makes gloo raise "Connection closed by peer").
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Callable

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from shoal.comm import ops
from shoal.debug import callsite, fingerprint, records, tables
from shoal.debug.channel import Channel
from shoal.debug.checker import Checker, GroupInfo, Pending
from shoal.debug.state import STATE, CollectiveRecord

MAX_TRACKED_WORKS = 256  # issued, not yet waited works we remember (bounded: futures of comm hooks are never waited)
# Key prefixes must never repeat within a process (enable/disable/enable, a second init_process_group),
# or a rank would read the previous round's fingerprints: <monitor>/<default group> numbers, which
# agree across ranks because every rank enables and initializes the same number of times.
_monitors = itertools.count(1)


class _AnySource:
    """A recv from any source, posted once the sender is known."""

    __slots__ = ("group", "rec", "fp")

    def __init__(self, group: GroupInfo, rec: CollectiveRecord, fp: dict):
        self.group, self.rec, self.fp = group, rec, fp


class Monitor:
    def __init__(self, check: bool, check_timeout_s: float):
        self.check, self.check_timeout_s = check, check_timeout_s
        self.channel: Channel | None = None
        self.checker: Checker | None = None
        self.index, self.generation = next(_monitors), 0
        self.on_failure: Callable[[CollectiveRecord, BaseException], None] | None = None  # set by the watchdog
        self._pg = None
        self._bind_lock = threading.Lock()
        self._groups: dict = {}
        self._counters: dict[str, itertools.count] = {}  # collectives per group
        self._p2p: dict[tuple, itertools.count] = {}  # messages per (group, src, dst, direction)
        self._works: OrderedDict[int, tuple] = OrderedDict()
        self._coalescing: dict = {}

    # -- binding to the job ---------------------------------------------------------------------
    def bind(self) -> Channel | None:
        """(Re)attach to the current default process group; a new group starts fresh numbering."""
        pg = c10d._world.default_pg
        if pg is self._pg:
            return self.channel
        with self._bind_lock:
            if pg is self._pg:
                return self.channel
            self.generation += 1
            self._groups, self._counters, self._p2p, self._works = {}, {}, {}, OrderedDict()
            STATE.seqs.clear()
            STATE.groups.clear()
            if pg is None:
                self.channel = self.checker = None
            else:
                STATE.rank = dist.get_rank()
                self.channel = Channel(c10d._get_default_store(), f"shoal/debug/{self.index}.{self.generation}/", self.check_timeout_s)
                self.checker = Checker(self.channel, self.check_timeout_s) if self.check else None
                # a first record now, not at the watchdog's first tick: a rank killed early must still
                # be identifiable (host, pid) for the report to call it dead
                records.publish(self.channel, STATE.rank, STATE.snapshot())
                self.channel.set(f"pulse/{STATE.rank}", STATE.pulse())
            self._pg = pg
        return self.channel

    def set_check(self, check: bool, check_timeout_s: float) -> None:
        """Turn checking on or off mid-run (every rank must do the same at the same point)."""
        self.check, self.check_timeout_s = check, check_timeout_s
        if self.channel is not None:
            self.channel.timeout_s = check_timeout_s
            self.checker = Checker(self.channel, check_timeout_s) if check else None

    @staticmethod
    def is_jobs(pg) -> bool:
        """A group of this job's torch.distributed world, not one a library keeps on its own (torchft's
        replica groups reconfigure themselves when a peer dies; their failures are not this job's)."""
        return pg in c10d._world.pg_names

    def group(self, pg) -> GroupInfo:
        g = self._groups.get(pg)
        if g is None:
            try:
                ranks = dist.get_process_group_ranks(pg)
            except (ValueError, RuntimeError, KeyError):  # a group torch.distributed does not know by name
                ranks = list(range(pg.size()))
            desc = getattr(pg, "group_desc", "") or ""
            g = self._groups[pg] = GroupInfo(pg.group_name, desc, ranks, pg.rank())
            STATE.groups[g.name] = tables.rank_list(ranks)
        return g

    def group_by_name(self, name: str) -> GroupInfo:
        g = self._groups.get(name)
        if g is None:
            g = self._groups[name] = self.group(c10d._resolve_process_group(name))
        return g

    # -- collectives ----------------------------------------------------------------------------
    def begin(self, g: GroupInfo, op: str, api: str | None, fp_fn: Callable[[], dict]) -> CollectiveRecord:
        """Number and record a collective; when checking, block until all ranks agree on it."""
        if c10d._world.default_pg is not self._pg:
            self.bind()
        site, frame_api, via = callsite.find()
        counter = self._counters.get(g.name) or self._counters.setdefault(g.name, itertools.count(1))
        seq = STATE.seqs[g.name] = next(counter)  # next() is atomic under the GIL: no lock on the hot path
        rec = CollectiveRecord(op, api or frame_api or ops.friendly(op), g.name, seq, site, via)
        STATE.inflight = rec
        STATE.recent.append(rec)
        STATE.progress()
        if self.checker is not None:
            rec.status = "checking"
            try:
                self.checker.collective(g, rec, fp_fn())
            except BaseException:
                rec.status, STATE.inflight = "mismatch", None
                raise
        rec.status = "issued"
        return rec

    def begin_p2p(self, pg, op: str, args: tuple) -> tuple[CollectiveRecord, Pending | None]:
        if c10d._world.default_pg is not self._pg:
            self.bind()
        g = self.group(pg)
        tensors, peer, tag = args[0], (args[1] if op != "recv_anysource" else None), args[-1]
        send = op == "send"
        site, api, via = callsite.find()
        peer_rank = g.ranks[peer] if peer is not None else None
        key = (g.name, g.index if send else peer, peer if send else g.index, send)
        n = next(self._p2p.get(key) or self._p2p.setdefault(key, itertools.count(1)))
        rec = CollectiveRecord(op, api or ops.friendly(op), g.name, n, site, via, peer=peer_rank)
        STATE.inflight = rec
        STATE.recent.append(rec)
        STATE.progress()
        pending = None
        if self.checker is not None:
            fp = fingerprint.from_p2p(op, tensors, tag)
            # recv from any source: the sender is known only once it arrives (see after_wait)
            pending = self.checker.post_p2p(g, rec, fp, send, peer) if peer is not None else _AnySource(g, rec, fp)
        rec.status = "issued"
        return rec, pending

    def issued(self, pg, rec: CollectiveRecord, work, pending: Pending | None) -> None:
        """Remember the Work so its wait() can be attributed (and, for p2p, verified)."""
        batch = self._coalescing.get(pg)
        if batch is not None:  # NCCL-style coalescing: one Work for the batch comes at the end
            batch.append((rec, pending))
            return
        if work is None:
            STATE.inflight = None
            rec.status = "done"
            return
        self._works[id(work)] = (work, [rec], [pending] if pending else [])
        if len(self._works) > MAX_TRACKED_WORKS:
            self._works.popitem(last=False)

    def coalescing(self, pg, start: bool, work=None) -> None:
        if start:
            self._coalescing[pg] = []
        else:
            batch = self._coalescing.pop(pg, [])
            if work is not None and batch:
                self._works[id(work)] = (work, [r for r, _ in batch], [p for _, p in batch if p])

    def before_wait(self, work) -> tuple[list[CollectiveRecord], list] | None:
        entry = self._works.pop(id(work), None)
        if entry is None:
            return None
        _, recs, pendings = entry
        for rec in recs:
            rec.status = "waiting"
        STATE.inflight = recs[-1]
        if pendings and self.checker is not None:
            try:
                for p in pendings:
                    if isinstance(p, Pending):
                        self.checker.verify_p2p(p)
            except BaseException:
                for rec in recs:
                    rec.status = "mismatch"
                STATE.inflight = None
                raise
        return recs, pendings

    def after_wait(self, recs: list[CollectiveRecord], work=None, pendings=()) -> None:
        for p in pendings:
            if isinstance(p, _AnySource) and self.checker is not None:
                # post the receive under the sender's pair counter, which the sender's wait() reads;
                # no check on this side: the data already arrived
                src = work._source_rank()
                key = (p.group.name, src, p.group.index, False)
                p.rec.seq = next(self._p2p.get(key) or self._p2p.setdefault(key, itertools.count(1)))
                p.rec.peer = p.group.ranks[src]
                self.checker.post_p2p(p.group, p.rec, p.fp, False, src)
        for rec in recs:
            rec.status = "done"
        if STATE.inflight is recs[-1]:
            STATE.inflight = None
        STATE.progress()

    def failed(self, rec: CollectiveRecord | None, exc: BaseException) -> None:
        """A collective raised inside torch (not a mismatch of ours): let the watchdog report."""
        if rec is not None:
            rec.status = "failed"
        if self.on_failure is not None and rec is not None:
            self.on_failure(rec, exc)
