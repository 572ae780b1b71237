"""The hang report: which ranks are stuck where, and whom each one waits for.

A pure function of the ranks' progress records and stack dumps, so it is tested without any
process hanging. Ranks in the same situation share a line, so 512 ranks waiting on one straggler
read as two lines, not 512.
"""

from __future__ import annotations

from shoal.debug import records, tables

TOP_FRAMES = 6


def _user_frame(dump: dict | None) -> dict | None:
    """The innermost main-thread frame outside torch: where the rank is in the user's code."""
    if not dump:
        return None
    main = next((t for t in dump.get("stacks", []) if t["main"]), None)
    if not main:
        return None
    for f in reversed(main["frames"]):
        if not f["site"].startswith("torch/") and "/shoal/debug/" not in f["site"] and not f["site"].startswith("shoal/debug/"):
            return f
    return main["frames"][-1] if main["frames"] else None


def waiting_for(rank: int, rec: dict, recs: dict[int, dict], gone: set[int]) -> list[int]:
    """Ranks that have not yet entered the collective `rank` is in (or, for p2p, the peer)."""
    cur = rec.get("inflight")
    if not cur:
        return []
    if cur.get("peer") is not None:
        return [cur["peer"]]
    members = tables.parse_rank_list(rec.get("groups", {}).get(cur["group"], ""))
    behind = []
    for q in members:
        if q == rank:
            continue
        other = recs.get(q)
        if q in gone or other is None or other.get("seqs", {}).get(cur["group"], 0) < cur["seq"]:
            behind.append(q)
    return behind


def status(rank: int, rec: dict | None, dump: dict | None, dead: dict[int, str], recs: dict[int, dict],
           gone: set[int]) -> tuple[str, list[int]]:
    """(one status phrase for this rank, the ranks it waits for)."""
    if rank in dead:  # silent ranks: dead, not answering, or without a record
        return f"{dead[rank]}; last seen: " + records.where(rec).split(", heartbeat")[0], []
    if rec is None:
        return "no progress record (watchdog not enabled on this rank?)", []
    if rec.get("exit"):
        return f"exited ({rec['exit']})", []
    cur = rec.get("inflight")
    top = _user_frame(dump)
    at = f" at {top['site']}" + (f": {top['line']}" if top and top["line"] else "") if top else ""
    if cur:
        wait = waiting_for(rank, rec, recs, gone)
        what = records.describe(cur)
        return f"in {what}", wait
    step = f"step {rec['step']}" if rec.get("step", -1) >= 0 else "before the first step"
    phase = f", phase '{rec['phase']}'" if rec.get("phase") else ""
    return f"NOT in a collective: {step}{phase}{at}", []


def _disagreements(recs: dict[int, dict]) -> list[str]:
    """Ranks in the same collective number of a group but a different op: a mismatch that hung."""
    seen: dict[tuple[str, int], dict[str, list[int]]] = {}
    for r, rec in recs.items():
        cur = rec.get("inflight")
        if cur and cur.get("peer") is None:
            seen.setdefault((cur["group"], cur["seq"]), {}).setdefault(cur["api"], []).append(r)
    out = []
    for (group, seq), kinds in sorted(seen.items()):
        if len(kinds) > 1:
            parts = "; ".join(f"ranks {tables.rank_list(v)}: {k}" for k, v in kinds.items())
            out.append(f"mismatch: collective #{seq} of group {group} differs between ranks ({parts}); "
                       "debug.check_collectives = true catches this before it hangs")
    return out


def render(why: str, world: int, recs: dict[int, dict], dumps: dict[int, dict], dead: dict[int, str],
           exit_code: int | None) -> str:
    gone = set(dead) | {r for r, rec in recs.items() if rec.get("exit")}
    rows: dict[tuple[str, tuple[int, ...]], list[int]] = {}
    for r in range(world):
        phrase, wait = status(r, recs.get(r), dumps.get(r), dead, recs, gone)
        rows.setdefault((phrase, tuple(wait)), []).append(r)
    waited_on: dict[int, list[int]] = {}
    for (_, wait), ranks in rows.items():
        for q in wait:
            waited_on.setdefault(q, []).extend(ranks)

    def who(ranks) -> str:
        return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {tables.rank_list(list(ranks))}"

    out = ["=" * 24 + " shoal hang report " + "=" * 24, f"why: {why}"]
    for (phrase, wait), ranks in sorted(rows.items(), key=lambda kv: kv[1][0]):
        line = f"  {who(ranks)}: {phrase}"
        if wait:
            line += f" -- waiting for {who(list(wait))}"
        waiters = sorted({w for r in ranks for w in waited_on.get(r, []) if w not in ranks})
        if waiters:
            line += f"   <- {who(waiters)} wait for it"
        out.append(line)
    out += _disagreements(recs)
    culprits = sorted(q for q in waited_on if q in dead or q not in recs or not (recs[q].get("inflight")))
    if culprits:
        out.append(f"likely cause: {who(culprits)} -- others wait for it and it is not in that collective")
    out.append("each rank's last collectives and main-thread stack (innermost last):")
    for r in range(world):
        rec, dump = recs.get(r), dumps.get(r)
        out.append(f"  rank {r}: {records.where(rec)}")
        for c in (rec or {}).get("recent", [])[-3:]:
            out.append(f"    {c['status']:>8}: {records.describe(c)}")
        main = next((t for t in (dump or {}).get("stacks", []) if t["main"]), None)
        if main:
            for f in main["frames"][-TOP_FRAMES:]:
                out.append(f"      {f['site']}" + (f": {f['line']}" if f["line"] else ""))
        elif dump is None:
            why = dead[r].split(":")[0].lower() if r in dead else "exited" if (rec or {}).get("exit") else "did not answer"
            out.append(f"      (no stack: {why})")
    if exit_code is not None:
        out.append(f"every live rank now exits with code {exit_code} so an elastic restart can take over")
    out.append("=" * 67)
    return "\n".join(out)
