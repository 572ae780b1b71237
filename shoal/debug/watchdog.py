"""The hang watchdog: a daemon thread per rank that publishes progress and notices a stalled job.

Every `interval` seconds it writes this rank's record to the store (one fire-and-forget set: the
hot path never touches the store). When this rank has made no progress for hang_timeout_s it reads
every rank's small pulse; when none has progressed either (dead ranks count as stuck) it starts
the incident: one report, a stack from every live rank, then exit with HANG_EXIT_CODE so an elastic
restart can take over. Python threads keep running while the main thread waits inside a gloo or
NCCL collective because c10d releases the GIL there; that is what makes this work.

It also turns SIGTERM from the launcher (which stops all workers when one dies) into a report
when this rank is stuck in a collective, since a rank stuck in C++ never runs Python signal
handlers on its main thread.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time

import torch.distributed as dist

from shoal.debug import records
from shoal.debug.incident import Incident, emit
from shoal.debug.records import pid_gone
from shoal.debug.state import HANG_EXIT_CODE, STATE
from shoal.worker.said import a_peer_refused


def interval_for(hang_timeout_s: float) -> float:
    return min(2.0, max(0.2, hang_timeout_s / 10))


FIRST_STEP_POLL_S = 0.1
"""Before this rank's first step, how often the watchdog looks for it, to publish it at once: a rank killed
within an interval of starting to train was otherwise reported as "before the first step" (its last record)."""


class Watchdog:
    def __init__(self, monitor, hang_timeout_s: float):
        self.monitor, self.hang_timeout_s = monitor, hang_timeout_s
        self.interval = interval_for(hang_timeout_s)
        self.dead_after = max(2.0, 3 * self.interval)  # a heartbeat unchanged this long: the rank is gone
        self._stop = threading.Event()
        self._sigterm = False
        self._graceful = False  # SIGTERM is the trainer's to handle (stop after the step, save)
        self._store_gone = False
        self._wakeup_r = self._wakeup_w = None
        self._old_handler = self._old_wakeup = None
        self._seen: dict[int, tuple[str, float]] = {}
        self.thread = threading.Thread(target=self._run, name="shoal-debug-watchdog", daemon=True)
        self.incident = Incident(monitor, grace_s=self.dead_after)

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> None:
        # The clock starts now, not when shoal.debug was imported: importing torch, reading the data
        # and building the model may take longer than hang_timeout_s and are no hang.
        STATE.progress_t = max(STATE.progress_t, time.time())
        self._install_sigterm()
        self.thread.start()
        self.monitor.on_failure = self._on_failure

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._wakeup_w is not None:
            os.write(self._wakeup_w, b"\0")
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout_s)
        self._uninstall_sigterm()
        self.monitor.on_failure = None

    def _install_sigterm(self) -> None:
        """Route SIGTERM to this thread (via the wakeup fd) when nobody else handles it, or when the
        trainer's handler does (shoal/train/preempt.py: stop after the step and save), chained to it."""
        current = signal.getsignal(signal.SIGTERM)
        self._graceful = getattr(current, "shoal_stops_after_a_step", False)
        if threading.current_thread() is not threading.main_thread() or not (current is signal.SIG_DFL or self._graceful):
            return
        self._wakeup_r, self._wakeup_w = os.pipe()
        os.set_blocking(self._wakeup_w, False)
        old = signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        if old != -1:  # someone (asyncio) owns the wakeup fd: give it back and poll our flag instead
            signal.set_wakeup_fd(old)
        self._old_wakeup = old
        self._old_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _uninstall_sigterm(self) -> None:
        if self._old_handler is None or threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._old_handler)
        if self._old_wakeup == -1:
            signal.set_wakeup_fd(-1)
        self._old_handler = None
        for fd in (self._wakeup_r, self._wakeup_w):
            os.close(fd)
        self._wakeup_r = self._wakeup_w = None

    def _on_sigterm(self, signum, frame) -> None:
        self._sigterm = True  # the watchdog thread acts on it; this handler may never run if main is in C++
        if callable(self._old_handler):
            self._old_handler(signum, frame)

    # -- the loop -------------------------------------------------------------------------------
    def _sleep(self) -> None:
        """Until the next tick: one interval, or, before the first step, until that step (FIRST_STEP_POLL_S)."""
        end = time.monotonic() + self.interval
        while (left := end - time.monotonic()) > 0 and not (self._stop.is_set() or self._sigterm):
            before_first_step = STATE.step < 0
            self._wait(min(left, FIRST_STEP_POLL_S) if before_first_step else left)
            if before_first_step and STATE.step >= 0:
                return

    def _wait(self, seconds: float) -> None:
        if self._wakeup_r is None or self._old_wakeup != -1:
            self._stop.wait(seconds)
            return
        ready, _, _ = select.select([self._wakeup_r], [], [], seconds)
        if ready:
            data = os.read(self._wakeup_r, 64)
            if signal.SIGTERM.value in data:
                self._sigterm = True

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sigterm:
                self._on_terminate()
            if dist.is_initialized() and not self._store_gone:  # enable() may come before init_process_group
                try:
                    self._tick()
                except dist.DistNetworkError:  # the store's host is gone: nothing left to publish to
                    self._store_gone = True
                except Exception as e:  # a transient error: try again next time
                    if os.environ.get("SHOAL_DEBUG_VERBOSE"):
                        emit(f"shoal: watchdog on rank {STATE.rank}: {type(e).__name__}: {e}")
            self._sleep()

    def _tick(self) -> None:
        ch = self.monitor.bind()
        if ch is None:
            return
        rank = STATE.rank
        records.publish(ch, rank, STATE.snapshot())
        ch.set(f"pulse/{rank}", STATE.pulse())
        if self.incident.started:
            return
        if ch.present(["incident"])[0]:  # another rank started one
            self.incident.run("(joined)", HANG_EXIT_CODE)
            self._exit(HANG_EXIT_CODE)
        stall = time.time() - STATE.progress_t
        if stall >= self.hang_timeout_s and self._everyone_stuck(ch):
            why = (f"no rank made progress for {stall:.1f} s (debug.hang_timeout_s = {self.hang_timeout_s:g}), "
                   f"noticed by rank {rank}")
            self.incident.run(why, HANG_EXIT_CODE)
            self._exit(HANG_EXIT_CODE)

    def _everyone_stuck(self, ch) -> bool:
        """True when every rank is stalled past the timeout, dead, or gone."""
        world = dist.get_world_size()
        keys = [f"pulse/{r}" for r in range(world)]
        every = ch.get_all(keys, timeout_s=0.5)  # one round trip when every rank has a pulse (the usual case)
        if every is not None:
            values = dict(enumerate(every))
        else:
            have = [r for r, p in enumerate(ch.present(keys)) if p]
            values = dict(zip(have, ch.get_all([keys[r] for r in have], timeout_s=5.0) or []))
        now = time.time()
        check_grace = self.monitor.check_timeout_s + 2 * self.interval
        for r, raw in values.items():
            beat, progress_t, checking, exited = raw.decode().split()
            hb, progress_t, checking = float(beat), float(progress_t), float(checking)
            if self._seen.get(r, ("",))[0] != beat:  # heartbeat moved since we last looked
                self._seen[r] = (beat, now)
            if exited == "1" or now - self._seen[r][1] > self.dead_after:
                continue  # gone: it cannot make progress, and is not "busy" either
            if checking and hb - checking < check_grace:
                return False  # it is in the checker's exchange; the checker will report
            if hb - progress_t < self.hang_timeout_s:
                return False
        return True

    # -- endings ----------------------------------------------------------------------------------
    def _on_failure(self, rec, exc: BaseException) -> None:
        """A collective raised (called on the thread that issued it); report before re-raising."""
        if STATE.rank is None or self.monitor.channel is None:
            return
        if self.incident.started:  # a consequence of the incident (the reporter exited): leave quietly
            self.incident.done.wait(self.incident.grace_s + 10)
            self._exit(HANG_EXIT_CODE)
        if a_peer_refused():  # a peer stopped on a user's mistake and said so in one line: nothing to report
            return
        why = f"{records.describe(rec.to_dict())} failed on rank {STATE.rank}: {records.short_error(exc)}"
        self.incident.run(why, None)
        if self._sigterm:  # the launcher asked us to stop while we were reporting
            self._exit(128 + signal.SIGTERM)

    def _on_terminate(self) -> None:
        """SIGTERM: report first if this rank is stuck in a collective because a rank failed, then go.

        A plain stop (Ctrl-C, a scheduler ending the job) exits quietly even mid-collective, or,
        under the trainer (graceful), is left to it: every rank stops after the step and saves. A
        report is for the launcher tearing the job down after a rank died or crashed.
        """
        cur = STATE.inflight
        failed = self._failed_ranks() if cur is not None and cur.status in ("waiting", "issued", "checking") else []
        if self.incident.started:
            self.incident.done.wait(self.incident.grace_s + 10)
        elif failed and not a_peer_refused():
            why = (f"the launcher is terminating rank {STATE.rank} in {records.describe(cur.to_dict())} "
                   f"after rank {failed[0]} failed")
            self.incident.run(why, 128 + signal.SIGTERM)
        elif self._graceful:
            self._sigterm = False
            return
        self._exit(128 + signal.SIGTERM)

    def _failed_ranks(self) -> list[int]:
        """Ranks whose process is gone (on this host) or that exited with an error."""
        ch = self.monitor.channel
        if ch is None:
            return []
        try:
            recs = records.read(ch, list(range(dist.get_world_size())))
        except Exception:
            return []
        host = socket.gethostname()
        return [r for r, rec in sorted(recs.items()) if r != STATE.rank and (
            str(rec.get("exit") or "").startswith("error") or (rec["host"] == host and pid_gone(rec["pid"])))]

    def _exit(self, code: int) -> None:
        STATE.exit = f"exit code {code}"
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
