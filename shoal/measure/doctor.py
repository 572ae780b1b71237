"""`shoal doctor`: environment checks, then a communication benchmark across N local ranks.

The benchmark runs as N workers (shoal.measure.commbench) through the same launcher as `shoal run`;
this module turns their raw per-rank timings into nccl-tests rows (`summarize`, a pure function
the tests feed with timings they choose) and names stragglers.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shoal.comm.ops import BENCH_OPS, busbw
from shoal.debug import stragglers
from shoal.measure import envcheck
from shoal.errors import UserError

OUT_FILES = ("comm_bench.json", "comm_busbw.*")
"""What the benchmark writes into --out: an earlier doctor's are replaced, anything else is refused."""

_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
          "G": 2**30, "GB": 2**30, "GIB": 2**30}


def parse_size(text: str, field_name: str = "--max-size") -> int:
    """'256M' -> 268435456 (binary units, as nccl-tests' -b/-e)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS or int(m.group(1)) <= 0:
        raise UserError(field_name, text, "use a positive byte count like 1024, 64K, 256M or 1G")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def sizes(min_size: int, max_size: int, factor: int) -> list[int]:
    if min_size > max_size:
        raise UserError("--min-size", min_size, f"must not exceed --max-size ({max_size})")
    if factor < 2:
        raise UserError("--factor", factor, "must be 2 or more")
    out, s = [], min_size
    while s <= max_size:
        out.append(s)
        s *= factor
    return out


@dataclass
class Row:
    op: str
    size: int  # bytes, as nccl-tests counts them for the op
    time_s: float  # the slowest rank's time per iteration: the collective is done when it is
    algbw: float  # bytes/s
    busbw: float  # bytes/s
    iters: int


@dataclass
class Report:
    checks: list[envcheck.Check]
    world: int = 0
    backend: str = ""
    rows: list[Row] = field(default_factory=list)
    compute_gflops: list[float] = field(default_factory=list)
    link_gbps: list[float] = field(default_factory=list)  # per rank, from the largest send/recv ring
    slow_compute: dict[int, float] = field(default_factory=dict)
    slow_link: dict[int, float] = field(default_factory=dict)
    figure: Path | None = None

    @property
    def ok(self) -> bool:
        return not any(c.verdict == "fail" for c in self.checks)

    def as_dict(self) -> dict:
        """`shoal doctor --json`: the checks, the nccl-tests rows (bytes and bytes/s), the stragglers."""
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks], "world": self.world,
                "backend": self.backend, "rows": [asdict(r) for r in self.rows], "compute_gflops": self.compute_gflops,
                "link_gbps": self.link_gbps, "slow_compute": self.slow_compute, "slow_link": self.slow_link,
                "figure": str(self.figure) if self.figure else None}


def default_nproc() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def summarize(raw: dict) -> Report:
    """Raw worker output -> rows with nccl-tests algbw/busbw, plus straggler verdicts."""
    n = raw["world"]
    rep = Report(checks=[], world=n, backend=raw.get("backend", ""), compute_gflops=raw.get("compute_gflops", []))
    for r in raw["results"]:
        t = max(r["times"])
        rep.rows.append(Row(r["op"], r["size"], t, r["size"] / t, busbw(r["op"], r["size"], t, n),
                            r.get("iters", 0)))
    ring = [r for r in raw["results"] if r["op"] == "sendrecv"]
    if ring:  # each rank's own view of its links at the largest size
        biggest = max(ring, key=lambda r: r["size"])
        rep.link_gbps = [biggest["size"] / t / 1e9 for t in biggest["times"]]
        rep.slow_link = stragglers.slow_ranks(rep.link_gbps)
    if rep.compute_gflops:
        rep.slow_compute = stragglers.slow_ranks(rep.compute_gflops)
    return rep


def check_fits(nproc: int, max_size: int, shown: str) -> None:
    """Each rank holds about twice the largest message (all_to_all's send and receive buffers): refuse
    a --max-size this machine's ranks cannot hold, which the OOM killer would end midway."""
    from shoal.launch.memory_check import check_local_ranks

    device = check_local_ranks(nproc)
    if device is None or 2 * max_size + device.reserved <= device.capacity:
        return
    room = (device.capacity - device.reserved) / 2
    raise UserError("--max-size", shown, f"each rank holds about twice that, but {device.what} leaves "
                                         f"{human_bytes(int(device.capacity))} per rank; give at most "
                                         f"{human_bytes(int(room))}")


def run(nproc: int, size_list: list[int], ops: list[str], out_dir: Path, budget_s: float = 0.1,
        max_iters: int = 50) -> Report:
    """Checks, then the benchmark on `nproc` local ranks; the figure goes to out_dir."""
    from shoal.launch.forkserver_start import stop
    from shoal.launch.local import launch, prestart

    if nproc < 1:
        raise UserError("--nproc", nproc, "must be a positive integer")
    unknown = [op for op in ops if op not in BENCH_OPS]
    if unknown:
        raise UserError("--ops", ",".join(unknown), f"choose from {','.join(BENCH_OPS)}")
    worker = ["-m", "shoal.measure.commbench"]
    prestart(worker, nproc)  # the workers' forkserver imports torch beside the checks below
    checks = envcheck.run_all(nproc)
    if any(c.verdict == "fail" for c in checks):
        stop()  # no benchmark: nothing will be forked from it
        return Report(checks=checks)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / "comm_bench.json"
    raw_path.unlink(missing_ok=True)
    code = launch([*worker, "--out", str(raw_path), "--sizes", ",".join(map(str, size_list)),
                   "--ops", ",".join(ops), "--budget", str(budget_s), "--max-iters", str(max_iters)], nproc)
    if code != 0 or not raw_path.exists():
        checks.append(envcheck.Check("benchmark", "fail", f"the {nproc}-rank benchmark failed (exit code {code}); see above"))
        return Report(checks=checks)
    rep = summarize(json.loads(raw_path.read_text()))
    rep.checks = checks
    from shoal.report.comm_figures import plot_bandwidth

    rep.figure = plot_bandwidth(rep.rows, rep.world, rep.backend, out_dir / "comm_busbw.png")
    return rep
