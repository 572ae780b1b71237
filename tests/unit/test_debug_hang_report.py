"""The hang report from hand-made progress records: who is stuck, whom they wait for, who is dead."""

from __future__ import annotations

from shoal.debug import hang_report


def coll(api, seq, status="waiting", site="train.py:42 in step", group="0", peer=None):
    return {"op": api, "api": api, "group": group, "seq": seq, "site": site, "via": None, "peer": peer,
            "shapes": "", "t_start": 100.0, "status": status}


def record(rank, seq, inflight=True, step=5, exit=None, api="all_reduce", world=4):
    cur = coll(api, seq) if inflight else None
    recent = [coll(api, s, "done") for s in range(max(1, seq - 2), seq)] + ([cur] if cur else [])
    return {"rank": rank, "host": "h", "pid": 1000 + rank, "step": step, "phase": "forward", "progress_n": 1,
            "progress_t": 100.0, "hb": 104.0, "inflight": cur, "recent": recent, "seqs": {"0": seq},
            "groups": {"0": f"0-{world - 1}"}, "exit": exit}


def dump(site, line):
    return {"stacks": [{"name": "MainThread", "main": True, "frames": [
        {"site": site, "line": line}, {"site": "torch/distributed/distributed_c10d.py:3252 in all_reduce", "line": "work.wait()"}]}]}


def test_sleeping_rank_is_the_culprit():
    recs = {0: record(0, 7), 1: record(1, 6, inflight=False), 2: record(2, 7), 3: record(3, 7)}
    dumps = {0: dump("train.py:42 in step", "dist.all_reduce(g)"), 1: {"stacks": [{"name": "MainThread", "main": True,
             "frames": [{"site": "train.py:40 in step", "line": "time.sleep(1000)"}]}]},
             2: dump("train.py:42 in step", "dist.all_reduce(g)"), 3: dump("train.py:42 in step", "dist.all_reduce(g)")}
    text = hang_report.render("no progress", 4, recs, dumps, {}, 124)
    assert "ranks 0,2-3: in all_reduce #7 on group 0 at train.py:42 in step -- waiting for rank 1" in text
    assert "rank 1: NOT in a collective: step 5, phase 'forward' at train.py:40 in step: time.sleep(1000)" in text
    assert "<- ranks 0,2-3 wait for it" in text
    assert "likely cause: rank 1" in text
    assert "exits with code 124" in text


def test_dead_rank_is_named_and_has_no_stack():
    recs = {0: record(0, 3, world=3), 1: record(1, 2, inflight=False, world=3), 2: record(2, 3, world=3)}
    dumps = {0: dump("a.py:1 in f", "x"), 2: dump("a.py:1 in f", "x")}
    text = hang_report.render("failed", 3, recs, dumps, {1: "DEAD: process 1001 on h is gone (killed or crashed)"}, None)
    assert "rank 1: DEAD: process 1001 on h is gone" in text
    assert "ranks 0,2: in all_reduce #3" in text and "-- waiting for rank 1" in text
    assert "(no stack: dead)" in text
    assert "exits with code" not in text


def test_ranks_in_different_ops_at_the_same_number_are_a_mismatch():
    recs = {0: record(0, 4, world=2), 1: record(1, 4, api="all_gather", world=2)}
    text = hang_report.render("no progress", 2, recs, {}, {}, 124)
    assert "mismatch: collective #4 of group 0 differs between ranks" in text
    assert "all_gather" in text and "check_collectives" in text


def test_exited_rank_counts_as_gone():
    recs = {0: record(0, 9, world=2), 1: record(1, 8, inflight=False, exit="finished", world=2)}
    text = hang_report.render("no progress", 2, recs, {0: dump("a.py:1 in f", "x")}, {}, 124)
    assert "rank 1: exited (finished)" in text
    assert "rank 0: in all_reduce #9" in text and "waiting for rank 1" in text
    assert "(no stack: exited)" in text
