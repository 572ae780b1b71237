"""Progress records: each rank's state snapshot under `hb/<rank>` in the side channel.

The watchdog thread writes them; the checker reads one to say where a missing rank is, and the
hang report reads all of them. A record is the dict `RankState.snapshot()` returns.
"""

from __future__ import annotations

import json
import os
import re
import time

from shoal.debug.channel import Channel


def key(rank: int) -> str:
    return f"hb/{rank}"


def publish(channel: Channel, rank: int, snapshot: dict) -> None:
    channel.set(key(rank), json.dumps(snapshot))


def read(channel: Channel, ranks: list[int]) -> dict[int, dict]:
    """Records of those ranks that have one (a rank without a watchdog has none)."""
    present = channel.present([key(r) for r in ranks])
    have = [r for r, p in zip(ranks, present) if p]
    values = channel.get_all([key(r) for r in have], timeout_s=5.0) if have else []
    return {r: json.loads(v) for r, v in zip(have, values or [])}


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # zombie: dead, not yet reaped
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False


def gone(rec: dict | None, host: str) -> bool:
    """Whether the rank of this record will never answer again: it has exited, or its process on this host
    (the caller's) is gone. A rank on another host cannot be looked at from here: not gone."""
    return rec is not None and bool(rec.get("exit") or (rec["host"] == host and pid_gone(rec["pid"])))


def _coll(d: dict) -> str:
    peer = d.get("peer")
    peer = "" if peer is None else (f" to rank {peer}" if d["op"] == "send" else f" from rank {peer}")
    site = f" at {d['site']}" if d.get("site") else (f" via {d['via']}" if d.get("via") else "")
    return f"{d['api']}{peer} #{d['seq']} on group {d['group']}{site}"


def where(rec: dict | None, now: float | None = None) -> str:
    """One line: step, phase, the collective it is in or last finished, heartbeat age."""
    if rec is None:
        return "unknown (no progress record: is the watchdog on for that rank?)"
    now = time.time() if now is None else now
    if rec.get("exit"):
        return f"exited ({rec['exit']}) at step {rec.get('step', -1)}"
    parts = [f"step {rec['step']}" if rec.get("step", -1) >= 0 else "before the first step"]
    if rec.get("phase"):
        parts.append(f"phase '{rec['phase']}'")
    inflight = rec.get("inflight")
    if inflight:
        parts.append(f"in {_coll(inflight)} for {max(0.0, rec['hb'] - inflight['t_start']):.1f} s")
    elif rec.get("recent"):
        parts.append(f"not in a collective; last: {_coll(rec['recent'][-1])}")
    else:
        parts.append("not in a collective; none issued yet")
    parts.append(f"heartbeat {max(0.0, now - rec['hb']):.1f} s ago")
    return ", ".join(parts)


def describe(d: dict) -> str:
    return _coll(d)


def short_error(exc: BaseException) -> str:
    """The first sentence of a c10d/gloo error, without the C++ source location prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". This is typically")[0][:200]
