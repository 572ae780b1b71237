"""Fingerprints and the checker's tables, without processes."""

from __future__ import annotations

import torch
import torch.distributed as dist

from shoal.debug import fingerprint, tables


def fp_allreduce(shape, dtype=torch.float32, op=dist.ReduceOp.SUM):
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    return fingerprint.from_pg_call("allreduce", ([torch.zeros(shape, dtype=dtype)], opts))


def test_allreduce_fingerprint_and_key():
    fp = fp_allreduce((4, 8))
    assert fp["op"] == "all_reduce" and fp["shapes"] == "(4, 8)" and fp["dtypes"] == "float32"
    assert fp["reduce"] == "SUM"
    assert fingerprint.key(fp) == fingerprint.key(fp_allreduce((4, 8)))
    assert fingerprint.key(fp) != fingerprint.key(fp_allreduce((4, 9)))
    assert fingerprint.key(fp) != fingerprint.key(fp_allreduce((4, 8), torch.bfloat16))
    assert fingerprint.key(fp) != fingerprint.key(fp_allreduce((4, 8), op=dist.ReduceOp.MAX))


def test_differing_names_the_fields():
    a, b = fp_allreduce((4, 8)), fp_allreduce((4, 9), torch.bfloat16)
    assert fingerprint.differing([a, a, b]) == ["shapes", "dtypes"]
    assert fingerprint.differing([a, a]) == []


def test_gather_and_scatter_compare_only_what_every_rank_passes():
    opts = dist.GatherOptions()
    opts.rootRank = 0
    root = fingerprint.from_pg_call("gather", ([[torch.zeros(2)] * 3], [torch.zeros(2)], opts))
    leaf = fingerprint.from_pg_call("gather", ([], [torch.zeros(2)], opts))
    assert fingerprint.key(root) == fingerprint.key(leaf)  # outputs exist only on the root
    sopts = dist.ScatterOptions()
    sopts.rootRank = 0
    root = fingerprint.from_pg_call("scatter", ([torch.zeros(2)], [[torch.zeros(2)] * 3], sopts))
    leaf = fingerprint.from_pg_call("scatter", ([torch.zeros(2)], [], sopts))
    assert fingerprint.key(root) == fingerprint.key(leaf) and root["root"] == "0"


def test_broadcast_root_is_compared():
    def bcast(root):
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        return fingerprint.from_pg_call("broadcast", ([torch.zeros(3)], opts))
    assert fingerprint.differing([bcast(0), bcast(1)]) == ["root"]


def test_all_to_all_splits_cross_check():
    plan = [[1, 2, 1], [2, 1, 1], [1, 1, 2]]
    ins = [row[:] for row in plan]
    outs = [[plan[j][i] for j in range(3)] for i in range(3)]
    assert fingerprint.split_errors(ins, outs) == []
    ins[0] = [1, 1, 1]
    assert fingerprint.split_errors(ins, outs) == ["group rank 0 sends 1 rows to group rank 1, which expects 2"]
    fp = fingerprint.from_pg_call("all_to_all_single", (torch.zeros(6, 2), torch.zeros(3, 2), [], [], None))
    assert fingerprint.splits(fp, 3) == ([1, 1, 1], [2, 2, 2])  # empty splits: dim 0 split evenly


def test_rank_lists_round_trip():
    assert tables.rank_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert tables.parse_rank_list("0-2,5,7-8") == [0, 1, 2, 5, 7, 8]


def test_table_groups_ranks_and_marks_the_differing_row():
    same = dict(fp_allreduce((4, 8)), api="all_reduce", site="train.py:10 in step")
    odd = dict(fp_allreduce((4, 9)), api="all_reduce", site="train.py:12 in step")
    text = tables.render("title", {0: same, 1: odd, 2: same, 3: same}, ["shapes"])
    lines = text.splitlines()
    assert lines[0] == "title"
    assert "ranks 0,2-3" in lines[1] and lines[1].index("ranks 0,2-3") < lines[1].index("rank 1")
    shapes = next(line for line in lines if line.strip().startswith("shapes"))
    assert shapes.strip().startswith("shapes *") and "(4, 8)" in shapes and "(4, 9)" in shapes
    assert not next(line for line in lines if line.strip().startswith("dtypes")).strip().startswith("dtypes *")
    assert "train.py:12 in step" in text


def test_table_caps_columns():
    fps = {r: dict(fp_allreduce((r + 1,)), api="all_reduce") for r in range(10)}
    text = tables.render("t", fps, ["shapes"])
    assert "4 more groups" in text
