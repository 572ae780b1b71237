"""`shoal doctor [--nproc N] [--max-size 256M] [--out DIR]`: check the environment, benchmark the links.
`shoal doctor --peak`: the peak FLOP/s MFU is against, beside a measured matmul.
`shoal doctor --nnodes N --node-rank K --master HOST:PORT [--nproc P]` on every node: that node's
network, a shared --out, and all_reduce busbw inside and across nodes (shoal/measure/node_doctor.py)."""

from __future__ import annotations

from pathlib import Path

from shoal.cli.argtypes import float_at_least, int_at_least, non_empty, positive_int
from shoal.cli.node_args import add_node_args
from shoal.errors import UserError
from shoal.launch.multinode import multinode

VERDICT_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "info": "cyan"}
BENCH_FLAGS = ("--ops", "--min-size", "--max-size", "--factor", "--budget", "--out")
NODE_FLAGS = ("--nnodes", "--node-rank", "--master", "--ifname", "--rdzv-timeout", "--rdzv")


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check the environment and benchmark communication across N local ranks")
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="ranks for the benchmark (default: one per GPU, else 2)")
    p.add_argument("--min-size", default="1K", help="smallest message (default 1K; binary units)")
    p.add_argument("--max-size", default="256M", help="largest message (default 256M)")
    p.add_argument("--factor", type=int_at_least(2), default=4, help="size step between messages (default 4)")
    p.add_argument("--ops", type=non_empty("--ops all_reduce,all_gather", sep=","),
                   help="comma-separated subset of all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,sendrecv")
    p.add_argument("--budget", type=float_at_least(0, strict=True, most=600, what="seconds per size"),
                   default=0.1, help="seconds of timed iterations per size (default 0.1)")
    p.add_argument("--checks-only", action="store_true", help="environment checks only, no benchmark")
    p.add_argument("--peak", action="store_true", help="print the datasheet peak FLOP/s that MFU is against, "
                   "beside a measured matmul on this process's cores; no benchmark")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="for --peak (default fp32)")
    p.add_argument("--out", type=non_empty("--out runs/doctor"), default="runs/doctor",
                   help="where the raw timings and the plot go; with --nnodes, the directory checked to be shared "
                        "by all nodes (give the filesystem your runs will use)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    add_node_args(p)  # --nnodes, --node-rank, --master, --ifname, --rdzv-timeout, as shoal train has them
    p.set_defaults(func=run)
    p.set_defaults(defaults=vars(p.parse_args([])))  # what "not given" looks like, for refuse_unused


def run(args) -> int:
    from shoal.cli.console import print_json
    from shoal.comm.ops import BENCH_OPS
    from shoal.files import check_output_dir
    from shoal.launch.memory_check import check_local_ranks
    from shoal.measure import doctor, envcheck

    if args.peak:  # one matmul in this process: every flag of the checks, the benchmark and the nodes unused
        refuse_unused(args, "with --peak, which times one matmul in this process",
                      ("--nproc", "--checks-only", *BENCH_FLAGS, *NODE_FLAGS))
        return show_peak(args.precision, args.json)
    refuse_unused(args, "without --peak (it is the dtype of --peak's matmul)", ("--precision",))
    if multinode(args.nnodes, args.node_rank, args.master or "", args.ifname or "", args.rdzv_timeout, args.rdzv):
        return run_node(args)
    nproc = args.nproc if args.nproc is not None else doctor.default_nproc()
    if args.checks_only:  # as --nnodes does: a benchmark flag here would be silently unused
        refuse_unused(args, "with --checks-only, which runs no benchmark", BENCH_FLAGS)
        check_local_ranks(nproc)  # as the benchmark (doctor.check_fits), shoal run and verify: it only warned here
        rep = doctor.Report(checks=envcheck.run_all(nproc))
    else:
        check_output_dir("--out", args.out, own=doctor.OUT_FILES)
        sizes = doctor.sizes(doctor.parse_size(args.min_size, "--min-size"), doctor.parse_size(args.max_size),
                             args.factor)
        ops = args.ops or list(BENCH_OPS)
        doctor.check_fits(nproc, sizes[-1], args.max_size)
        rep = doctor.run(nproc, sizes, ops, Path(args.out), budget_s=args.budget)
    if args.json:
        print_json(rep.as_dict())
    else:
        render(rep)
    return 0 if rep.ok else 1


def render(rep) -> None:
    from rich.table import Table

    from shoal.cli.console import console as make_console

    console = make_console(highlight=False)
    checks = Table(title="environment", title_justify="left")
    for col in ("check", "verdict", "detail"):
        checks.add_column(col)
    for c in rep.checks:
        checks.add_row(c.name, f"[{VERDICT_STYLE[c.verdict]}]{c.verdict}[/]", c.detail)
    console.print(checks)
    if rep.rows:
        console.print(render_rows(rep))
        console.print(straggler_lines(rep))
        console.print(f"figure: {rep.figure}")


def run_node(args) -> int:
    """One node of `shoal doctor --nnodes`: its table; exit 2 (one line) when --out is not shared."""
    from rich.table import Table

    from shoal.cli.console import console as make_console
    from shoal.cli.console import print_json
    from shoal.files import check_output_dir
    from shoal.launch.memory_check import check_local_ranks
    from shoal.launch.multinode import check_world
    from shoal.measure import doctor, node_doctor

    refuse_unused(args, "with --nnodes, which times one all_reduce of --max-size bytes per network tier",
                  ("--ops", "--checks-only", "--min-size", "--factor"))
    check_output_dir("--out", args.out)
    nproc = args.nproc if args.nproc is not None else doctor.default_nproc()
    check_world(args.nnodes, nproc)
    check_local_ranks(nproc)  # before the wait for the other nodes
    rep = node_doctor.run(args.nnodes, args.node_rank, args.master or "", args.ifname or "", args.rdzv_timeout, nproc,
                          Path(args.out).resolve(), doctor.parse_size(args.max_size), args.budget)
    if args.json:
        print_json(rep.as_dict())
    else:
        t = Table(title=f"node {rep.node_rank} of {args.nnodes}", title_justify="left")
        for col in ("check", "verdict", "detail"):
            t.add_column(col)
        for name, verdict, detail in rep.rows:
            t.add_row(name, f"[{VERDICT_STYLE[verdict]}]{verdict}[/]", detail)
        make_console(highlight=False).print(t)
    if rep.not_shared:
        raise rep.not_shared
    return 0 if rep.as_dict()["ok"] else 1


def refuse_unused(args, mode: str, flags: tuple[str, ...]) -> None:
    """The first of `flags` given other than its default, which `mode` ("with --peak, which ...") has no use
    for: one line, rather than a setting silently ignored. The defaults are the parser's (args.defaults)."""
    for flag in flags:
        dest = flag[2:].replace("-", "_")
        value = getattr(args, dest)
        if value != args.defaults[dest]:
            shown = ",".join(value) if isinstance(value, list) else value
            raise UserError(flag, shown, f"does not apply {mode}; leave it out")


def render_rows(rep):
    """The nccl-tests style table: size, time, algbw, busbw per op (GB = 1e9 bytes)."""
    from rich.table import Table

    from shoal.measure.doctor import human_bytes

    t = Table(title=f"communication: {rep.world} ranks, {rep.backend}  "
                    "(busbw as nccl-tests: all_reduce x2(n-1)/n; all_gather, reduce_scatter, all_to_all x(n-1)/n)",
              title_justify="left")
    for col in ("op", "size", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
        t.add_column(col, justify="left" if col in ("op", "size") else "right")
    for r in rep.rows:
        t.add_row(r.op, human_bytes(r.size), str(r.size), f"{r.time_s * 1e6:.1f}", f"{r.algbw / 1e9:.4g}",
                  f"{r.busbw / 1e9:.4g}")
    return t


def straggler_lines(rep) -> str:
    lines = []
    for what, slow, values, unit in (("compute", rep.slow_compute, rep.compute_gflops, "GFLOP/s"),
                                     ("link", rep.slow_link, rep.link_gbps, "GB/s")):
        if not values:
            continue
        if slow:
            for r, ratio in slow.items():
                lines.append(f"[bold red]straggler[/]: rank {r} {what} {values[r]:.3g} {unit} is {ratio:.2f}x the "
                             f"median (slower than 0.7x)")
        else:
            lines.append(f"{what}: no straggler (all ranks within 0.7x of the median {unit}: "
                         + ", ".join(f"{v:.3g}" for v in values) + ")")
    return "\n".join(lines)


def show_peak(precision: str, as_json: bool = False) -> int:
    from rich.console import Console
    from rich.table import Table

    from shoal.hardware.peak import compare

    if as_json:
        from shoal.cli.console import print_json

        print_json({"precision": precision, "peak": [{"what": what, "flops": flops, "how": how}
                                                     for what, flops, how in compare(precision)]})
        return 0
    t = Table(title=f"peak {precision} FLOP/s (MFU in `shoal train` divides by the datasheet one)",
              title_justify="left")
    for col in ("", "GFLOP/s", "how"):
        t.add_column(col, justify="right" if col == "GFLOP/s" else "left")
    for what, flops, how in compare(precision):
        t.add_row(what, f"{flops / 1e9:,.1f}", how)
    Console(highlight=False).print(t)
    return 0
