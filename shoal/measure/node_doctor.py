"""`shoal doctor --nnodes N --node-rank K --master HOST:PORT`: one node's view of a multi-node job.

Run the same command on every node (as `shoal train --nnodes` is run). Before any worker starts,
shoal.launch.multinode.plan_node checks what a multi-node `shoal train` will use: the interface
that routes to the master, that the master's name resolves, and the rendezvous port (bindable on
node 0, answering on the others); its first problem is one line and exit 2. Then the workers
(shoal.measure.tiers) check that --out is one directory for all nodes and measure all_reduce busbw
inside a node and across nodes. Each node prints its own table.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from shoal.errors import UserError
from shoal.worker.shared_dir import unshared_message


@dataclass
class NodeReport:
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    """(check, verdict, detail): verdict ok | fail | info."""
    node_rank: int = 0
    not_shared: UserError | None = None

    def as_dict(self) -> dict:
        """`shoal doctor --nnodes ... --json`."""
        return {"node_rank": self.node_rank, "ok": not any(v == "fail" for _, v, _ in self.rows),
                "checks": [{"name": name, "verdict": verdict, "detail": detail} for name, verdict, detail in self.rows],
                "not_shared": str(self.not_shared) if self.not_shared else None}


def run(nnodes: int, node_rank: int, master: str, ifname: str, timeout: int, nproc: int, out: Path,
        size: int, budget_s: float) -> NodeReport:
    from shoal.launch.multinode import launch_nodes, plan_node

    plan = plan_node(nnodes, node_rank, master, ifname, timeout)  # raises the first network problem
    rep = NodeReport(node_rank=node_rank)
    rep.rows += [("interface", "ok", f"{plan.ifname} ({plan.local_addr}) routes to the master"),
                 ("master", "ok", f"{master} resolves to {plan.master_ip}"),
                 ("rendezvous", "ok", f"port {plan.port} " + ("is free to bind here (this node hosts it)"
                                                              if plan.is_host else "answers from node 0"))]
    with tempfile.TemporaryDirectory(prefix="shoal-doctor-") as tmp:  # this node's own disk
        report = Path(tmp) / "node.json"
        code = launch_nodes(["-m", "shoal.measure.tiers", "--dir", str(out), "--size", str(size),
                             "--budget", str(budget_s), "--report", str(report)], nproc, plan)
        if code != 0 or not report.exists():
            rep.rows.append(("benchmark", "fail", f"the workers failed (exit code {code}); see above"))
            return rep
        raw = json.loads(report.read_text())
    if raw["not_shared"]:
        rep.not_shared = unshared_message(raw["not_shared"], "--out", out)
        rep.rows.append(("shared --out", "fail", f"{out}: {raw['not_shared'][0]}"))
    else:
        rep.rows.append(("shared --out", "ok", f"{out}: every node reads every node's probe file"))
    for tier, what in (("inside", "inside this node"), ("across", "across nodes, one rank per node")):
        t = raw[tier]
        if t:
            rep.rows.append((f"all_reduce {tier}", "info",
                             f"busbw {t['busbw'] / 1e9:.4g} GB/s, {t['bytes'] / 2**20:.0f} MiB, {len(t['ranks'])} "
                             f"ranks {what} (ranks {','.join(map(str, t['ranks']))}), {t['time_s'] * 1e3:.1f} ms"))
    if raw["inside"] and raw["across"]:
        rep.rows.append(("tier ratio", "info", f"inside / across busbw = "
                                               f"{raw['inside']['busbw'] / raw['across']['busbw']:.1f}x"))
    return rep

