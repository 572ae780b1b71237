"""One hang report per job, assembled by the first rank that notices trouble.

Trouble is: no rank made progress for hang_timeout_s (the watchdog), a collective raised inside
torch (gloo raises "Connection closed by peer" when a peer dies), or the launcher is terminating a
rank that is stuck in a collective. The first rank to claim the `incident` key in the store writes
the report; every live rank (its watchdog sees the key within a second) prints its own stacks and
last collectives and posts them for the reporter. Ranks that never answer are checked: a process
that is gone is reported DEAD.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import torch.distributed as dist

from shoal.debug import hang_report, records, stacks
from shoal.debug.state import STATE

STACK_LIMIT = 40  # frames per thread posted to the reporter


def emit(text: str) -> None:
    """Write a block to stderr in one go so other processes' lines do not cut through it."""
    data = (text.rstrip("\n") + "\n").encode()
    while data:
        data = data[os.write(2, data):]


class Incident:
    def __init__(self, monitor, grace_s: float):
        self.monitor, self.grace_s = monitor, grace_s
        self._lock = threading.Lock()
        self._started = False
        self.done = threading.Event()

    @property
    def started(self) -> bool:
        return self._started

    def run(self, why: str, exit_code: int | None) -> None:
        """Take part in the incident (once per process; a second caller waits for the first)."""
        with self._lock:
            started, self._started = self._started, True
        if started:
            self.done.wait(self.grace_s + 10)
            return
        try:
            self._run(why, exit_code)
        except Exception as e:  # the store went away: its host (the agent, or rank 0) is likely dead
            recent = "\n".join(f"    {c.status:>8}: {records.describe(c.to_dict())}" for c in list(STATE.recent)[-5:])
            emit(f"shoal: rank {STATE.rank}: {why}\n  the job's c10d store is unreachable ({records.short_error(e)}): "
                 "the process hosting it (the launcher's agent, or rank 0) is probably dead, so there is no "
                 f"job-wide report; this rank: {records.where(STATE.snapshot())}\n  last collectives:\n"
                 f"{recent or '    (none)'}\n{stacks.format_threads(stacks.threads())}")
        finally:
            self.done.set()

    def _run(self, why: str, exit_code: int | None) -> None:
        ch, rank, world = self.monitor.channel, STATE.rank, dist.get_world_size()
        winner = json.loads(ch.claim("incident", json.dumps({"rank": rank, "why": why})))
        threads = stacks.threads(limit=STACK_LIMIT)
        records.publish(ch, rank, STATE.snapshot())  # the freshest record, for the report
        ch.set(f"dump/{rank}", json.dumps({"stacks": threads}))
        recent = "\n".join(f"    {c.status:>8}: {records.describe(c.to_dict())}" for c in list(STATE.recent)[-5:])
        emit(f"shoal: rank {rank}: {winner['why']}\n  this rank: {records.where(STATE.snapshot())}\n"
             f"  last collectives:\n{recent or '    (none)'}\n{stacks.format_threads(threads)}")
        if winner["rank"] != rank:
            ch.get_all(["incident/done"], timeout_s=self.grace_s + 5)
            return
        dumps = self._collect(ch, world)
        recs = records.read(ch, list(range(world)))
        silent = self._silent(recs, dumps, world)
        text = hang_report.render(winner["why"], world, recs, dumps, silent, exit_code)
        emit(text)
        out_dir = os.environ.get("SHOAL_DEBUG_DIR")
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            (Path(out_dir) / "hang_report.txt").write_text(text + "\n")
            (Path(out_dir) / "hang_report.json").write_text(json.dumps(
                {"why": winner["why"], "reporter": rank, "records": recs, "dumps": dumps, "silent": silent}, indent=1))
        ch.set("incident/done", "1")

    def _collect(self, ch, world: int) -> dict[int, dict]:
        """Stack dumps of every rank that answers within the grace period (polled: a dead rank
        never answers, and a blocking wait would end in a timeout warning from c10d). A rank whose
        process is gone on this host, or that has exited, is not waited for: the grace period is for
        ranks that cannot be seen from here (the survivors of a killed worker waited it out, 6 s)."""
        keys = [f"dump/{r}" for r in range(world)]
        recs, host = records.read(ch, list(range(world))), socket.gethostname()
        deadline, have = time.time() + self.grace_s, []
        while True:
            have = [r for r, p in enumerate(ch.present(keys)) if p]
            if all(r in have or records.gone(recs.get(r), host) for r in range(world)) or time.time() >= deadline:
                break
            time.sleep(0.1)
        values = ch.get_all([keys[r] for r in have], timeout_s=5.0) or []
        return {r: json.loads(v) for r, v in zip(have, values)}

    def _silent(self, recs: dict[int, dict], dumps: dict[int, dict], world: int) -> dict[int, str]:
        """Why each rank that did not answer is silent: its process is gone, or it is unresponsive."""
        out, host, now = {}, socket.gethostname(), time.time()
        for r in range(world):
            rec = recs.get(r)
            if r in dumps or (rec and rec.get("exit")):
                continue
            if rec is None:
                out[r] = "NO RECORD: never reported progress (watchdog off there, or died before it started)"
            elif records.gone(rec, host):
                out[r] = f"DEAD: process {rec['pid']} on {host} is gone (killed or crashed)"
            else:
                out[r] = (f"NOT ANSWERING: no stack within {self.grace_s:g} s, heartbeat {now - rec['hb']:.1f} s old "
                          f"(dead, or blocked in C code holding the GIL; pid {rec['pid']} on {rec['host']})")
        return out
