"""The debug monitor as an observer of the patch layer (shoal.comm.patch): which door means what.

The patch layer catches the calls; Monitor (monitor.py) numbers, records and checks them. This
module only translates: a ProcessGroup method is a collective or, for send/recv, a point-to-point
message; Work.wait is where async work blocks (the watchdog sees what a rank waits on, the checker
verifies point-to-point fingerprints); functional collectives and DTensor's shard_dim_alltoall
are collectives waited in C++ (wait_tensor), so they are done once issued.
`install(monitor).undo()` puts every patched function back (unless another observer still listens).
"""

from __future__ import annotations

import torch.distributed as dist

from shoal.comm import ops, patch
from shoal.debug import fingerprint
from shoal.debug.monitor import Monitor


class MonitorObserver(patch.Observer):
    doors = ("pg", "coalesce", "wait", "funcol", "dtensor")

    def __init__(self, mon: Monitor):
        self.mon = mon

    def undo(self) -> None:
        patch.detach(self)

    def before(self, door, name, target, args, kwargs):
        mon = self.mon
        if door == "pg":
            if not mon.is_jobs(target):
                return None  # torchft's cross-replica groups: a dead peer there is expected and handled
            if name in ops.P2P:
                rec, pending = mon.begin_p2p(target, name, args)
            else:
                rec, pending = mon.begin(mon.group(target), name, None, lambda: fingerprint.from_pg_call(name, args)), None
            return ("issued", target, rec, pending)
        if door == "coalesce":
            start = name == "_start_coalescing"
            if start:
                mon.coalescing(target, True)
            return None if start else ("coalesced", target, None, None)
        if door == "wait":
            tracked = mon.before_wait(target)
            return None if tracked is None else ("waited", target, *tracked)
        call = target  # funcol / dtensor: a FuncolCall
        if door == "funcol":
            group = call.get("group")
            group = dist.group.WORLD if group is None else group
            g = mon.group_by_name(call.funcol._resolve_group_name(group, call.get("tag", "")))
            op = ops.FUNCOL[name]
            rec = mon.begin(g, op, f"funcol.{name}", lambda: fingerprint.from_funcol(
                op, call.get("tensor"), call.get("reduce"), call.get("root"), call.get("out_splits"),
                call.get("in_splits")))
        else:  # dtensor's shard_dim_alltoall
            g = mon.group(call.get("mesh").get_group(call.get("mesh_dim")))
            rec = mon.begin(g, name, name, lambda: dict(
                fingerprint.from_funcol(name, call.get("input"), None, None, None, None),
                root=f"gather_dim={call.get('gather_dim')} shard_dim={call.get('shard_dim')}"))
        return ("issued", None, rec, None)

    def after(self, token, result) -> None:
        what, target, rec, extra = token
        if what == "issued":  # funcol/dtensor pass no target and no Work: done once issued
            self.mon.issued(target, rec, result if target is not None else None, extra)
        elif what == "coalesced":
            self.mon.coalescing(target, False, result)
        else:  # waited: rec is the list of records, extra their pending p2p checks
            self.mon.after_wait(rec, target, extra)

    def failed(self, token, exc) -> None:
        what, _, rec, _ = token
        if what == "issued":
            self.mon.failed(rec, exc)
        elif what == "waited":
            self.mon.failed(rec[-1], exc)


def install(mon: Monitor) -> MonitorObserver:
    observer = MonitorObserver(mon)
    patch.attach(observer)
    return observer
