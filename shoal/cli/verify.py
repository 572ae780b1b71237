"""`shoal verify [--nproc N] [--layouts "tp=2,pp=2;dp_shard=4,zero=1"] [--json]`: loss parity of layouts vs one process."""

from __future__ import annotations

from shoal.cli.argtypes import int_at_least, non_empty, nonnegative_float, positive_int


def register(sub) -> None:
    p = sub.add_parser("verify", help="prove parallel layouts compute what one process computes")
    p.add_argument("--nproc", type=int_at_least(2, "verify compares against 1 process"), default=4,
                   help="ranks to run the layouts on")
    p.add_argument("--layouts", type=non_empty("--layouts 'tp=2;dp_shard=2,zero=1'", sep=";"),
                   help="';'-separated layouts of key=value,... (default: all that fit)")
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--tolerance", type=nonnegative_float, default=1e-4,
                   help="largest difference that passes, for the loss, the gradient norm (relative) and each final "
                        "weight (computed in float64; see docs/parallelism.md for why 1e-4)")
    p.add_argument("--out", type=non_empty("--out runs/verify"), help="keep each layout's metrics here")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.cli.console import console as make_console
    from shoal.cli.console import print_json
    from shoal.files import check_output_dir
    from shoal.launch.memory_check import check_local_ranks
    from shoal.measure.parity import verify
    from shoal.train.parity import OUT_DIRS

    check_local_ranks(args.nproc)
    if args.out:
        check_output_dir("--out", args.out, own=OUT_DIRS)
    console = make_console()
    say = (lambda line: None) if args.json else console.print
    verdict = verify(args.nproc, args.layouts, args.steps, args.tolerance, args.out, say=say)
    if args.json:
        print_json(verdict.as_dict())
    else:
        render(console, verdict)
    return 0 if verdict.passed else 1


def render(console, v) -> None:
    from rich.table import Table

    table = Table(title=f"parity vs 1 process ({v.steps} steps, float64, tolerance {v.tolerance:g}; "
                        f"grad norm relative, weights at the end)")
    for col in ("layout", "max |loss diff|", "max grad-norm diff", "max weight diff", "final loss", "result"):
        table.add_column(col)
    for r in v.results:
        table.add_row(r.layout, f"{r.loss_diff:.2e}", f"{r.grad_diff:.2e}", f"{r.weight_diff:.2e}",
                      f"{r.final_loss:.6f}", "[green]pass" if r.passed else "[red]FAIL")
    console.print(table)
    for layout, reason in v.skipped:
        console.print(f"not run on {v.nproc} ranks: {layout} ({reason})")
