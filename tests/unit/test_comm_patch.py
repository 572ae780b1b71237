"""The one patch layer: several observers at one door, tokens back on success and failure, and
every original back once the last observer leaves (a gloo world of 1, in process)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from shoal.comm import ops, patch
from shoal.comm.counter import CommCounter


class Recorder(patch.Observer):
    doors = ("pg", "op")

    def __init__(self):
        self.seen, self.ended = [], []

    def before(self, door, name, target, args, kwargs):
        self.seen.append((door, name))
        return name if door == "pg" else None

    def after(self, token, result):
        self.ended.append((token, "ok"))

    def failed(self, token, exc):
        self.ended.append((token, type(exc).__name__))


@pytest.fixture()
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_observers_share_one_patch_and_leave_no_trace(world_of_one):
    import torch.distributed._functional_collectives as funcol

    original = vars(ProcessGroup)["allreduce"]
    rec, counter = Recorder(), CommCounter()
    with counter:
        patch.attach(rec)
        assert patch.patched_doors() == ["op", "pg"]
        dist.all_reduce(torch.ones(3))
        funcol.all_reduce(torch.ones(3), "sum", dist.group.WORLD).wait()
        with pytest.raises(TypeError):
            dist.group.WORLD.allreduce("not a tensor")
        patch.detach(rec)
        dist.all_reduce(torch.ones(3))  # the counter still listens: the door stays patched
        assert vars(ProcessGroup)["allreduce"] is not original
    assert rec.seen == [("pg", "allreduce"), ("op", "all_reduce"), ("pg", "allreduce")]
    assert rec.ended == [("allreduce", "ok"), ("allreduce", "TypeError")]
    assert counter.bytes == {"all_reduce": 0}  # one rank sends nothing, but every call was counted
    assert patch.patched_doors() == [] and vars(ProcessGroup)["allreduce"] is original
    assert not isinstance(torch.ops._c10d_functional.all_reduce, patch._Packet)


def test_wire_bytes_follow_the_ring_column_of_the_table():
    S, n = 1200, 4
    assert ops.wire_bytes("all_reduce", S, n) == 2 * (n - 1) / n * S
    assert ops.wire_bytes("all_gather", S // n, n) == (n - 1) / n * S  # payload: this rank's 1/n
    assert ops.wire_bytes("reduce_scatter", S, n) == (n - 1) / n * S
    assert ops.wire_bytes("all_to_all", S, n, ops.own_chunk(S, [1, 2, 3, 6], 3, n)) == S / 2
    assert ops.wire_bytes("send", S, 2) == S and ops.wire_bytes("all_reduce", S, 1) == 0
    with pytest.raises(ValueError):
        ops.bus_factor("gather", n)  # nccl-tests has no bus factor for it; no guessing


def test_every_counted_method_has_a_wire_formula():
    """A method the counter counts must have a ring volume, or its bytes would silently be wrong."""
    for name, m in ops.PG_METHODS.items():
        if m.payload is not None:
            assert ops.wire_bytes(m.kind, 100, 4, 25) > 0, name
    for name, (kind, _) in ops.FUNCTIONAL_OPS.items():
        assert ops.wire_bytes(kind, 100, 4, 25) > 0, name
