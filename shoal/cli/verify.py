"""`shoal verify [--nproc N] [--layouts "tp=2,pp=2;dp_shard=4,zero=1"]`: loss parity of layouts vs one process."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from shoal.cli.argtypes import check_output_dir, int_at_least, nonnegative_float, positive_int


def register(sub) -> None:
    p = sub.add_parser("verify", help="prove parallel layouts compute what one process computes")
    p.add_argument("--nproc", type=int_at_least(2, "verify compares against 1 process"), default=4,
                   help="ranks to run the layouts on")
    p.add_argument("--layouts", default="", help="';'-separated layouts of key=value,... (default: all that fit)")
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--tolerance", type=nonnegative_float, default=1e-4, help="max |loss difference| that passes (fp32)")
    p.add_argument("--out", default="", help="keep each layout's metrics here")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.table import Table

    from shoal.cli.console import console as make_console

    from shoal.errors import UserError
    from shoal.launch.local import launch
    from shoal.parallel.mesh import resolve_dims
    from shoal.parallel.verify import Result, config_for, fitting_layouts, losses_of

    if args.nproc < 2:
        raise UserError("--nproc", args.nproc, "verify needs at least 2 ranks")
    if args.out:
        check_output_dir("--out", args.out)
    layouts = [x.strip() for x in args.layouts.split(";") if x.strip()]
    skipped = []
    if not layouts:
        layouts, skipped = fitting_layouts(args.nproc, args.steps)
    if not layouts:
        raise UserError("--nproc", args.nproc, "no default layout fits; pass --layouts")
    by_model: dict[str, list[float]] = {}
    for layout in layouts:  # every mistake is reported before anything starts
        cfg = config_for(layout, args.nproc, args.steps)
        resolve_dims(cfg.parallel, args.nproc, cfg.model_config(), global_batch=cfg.train.global_batch,
                     micro_batch=cfg.train.micro_batch)
        by_model.setdefault(cfg.model.preset, [])
    out = Path(args.out or tempfile.mkdtemp(prefix="shoal-verify-"))
    from shoal.train.trainer import train

    console = make_console()
    for preset in by_model:  # the single-process references, in this process
        ref_cfg = config_for(f"model={preset},dp_shard=1", 1, args.steps, global_batch=4 * args.nproc)
        train(ref_cfg, out / f"reference-{preset}", show=False)
        by_model[preset] = losses_of(out / f"reference-{preset}" / "metrics.jsonl")
    console.print(f"reference losses computed on 1 process; running {len(layouts)} layouts on {args.nproc} ranks ...")
    code = launch(["-m", "shoal.parallel.verify", str(out), str(args.nproc), str(args.steps), json.dumps(layouts)],
                  args.nproc)
    results = []  # a layout whose run died or wrote too few rows shows as inf: failing, never skipped
    for i, layout in enumerate(layouts):
        metrics = out / f"layout{i}" / "metrics.jsonl"
        ref = by_model[config_for(layout, args.nproc, args.steps).model.preset]
        got = losses_of(metrics) if metrics.exists() else []
        diff = max((abs(a - b) for a, b in zip(got, ref)), default=float("inf")) if len(got) == len(ref) else float("inf")
        results.append(Result(layout, diff, got[-1] if got else float("nan"), diff <= args.tolerance))
    table = Table(title=f"loss parity vs 1 process ({args.steps} steps, fp32, tolerance {args.tolerance:g})")
    for col in ("layout", "max |loss diff|", "final loss", "result"):
        table.add_column(col)
    for r in results:
        table.add_row(r.layout, f"{r.max_diff:.2e}", f"{r.final_loss:.6f}", "[green]pass" if r.passed else "[red]FAIL")
    console.print(table)
    for layout, reason in skipped:
        console.print(f"not run on {args.nproc} ranks: {layout} ({reason})")
    return 0 if code == 0 and all(r.passed for r in results) else 1
