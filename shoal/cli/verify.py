"""`shoal verify [--nproc N] [--layouts "tp=2,pp=2;dp_shard=4,zero=1"]`: loss parity of layouts vs one process."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from shoal.cli.argtypes import check_output_dir, int_at_least, non_empty, nonnegative_float, positive_int


def register(sub) -> None:
    p = sub.add_parser("verify", help="prove parallel layouts compute what one process computes")
    p.add_argument("--nproc", type=int_at_least(2, "verify compares against 1 process"), default=4,
                   help="ranks to run the layouts on")
    p.add_argument("--layouts", type=non_empty("--layouts 'tp=2;dp_shard=2,zero=1'", sep=";"),
                   help="';'-separated layouts of key=value,... (default: all that fit)")
    p.add_argument("--steps", type=positive_int, default=10)
    p.add_argument("--tolerance", type=nonnegative_float, default=1e-4,
                   help="largest difference that passes, for the loss, the gradient norm (relative) and each final "
                        "weight (fp32; see docs/parallelism.md for why 1e-4)")
    p.add_argument("--out", type=non_empty("--out runs/verify"), help="keep each layout's metrics here")
    p.set_defaults(func=run)


def run(args) -> int:
    from rich.table import Table

    from shoal.cli.console import console as make_console
    from shoal.errors import UserError
    from shoal.launch.local import launch
    from shoal.job import resolve
    from shoal.train.memory_check import check_local_ranks
    from shoal.train.verify import OUT_DIRS, compare, config_for, fitting_layouts

    if args.nproc < 2:
        raise UserError("--nproc", args.nproc, "verify needs at least 2 ranks")
    check_local_ranks(args.nproc)
    if args.out:
        check_output_dir("--out", args.out, own=OUT_DIRS)
    layouts = args.layouts or []
    skipped = []
    if not layouts:
        layouts, skipped = fitting_layouts(args.nproc, args.steps)
    if not layouts:
        raise UserError("--nproc", args.nproc, "no default layout fits; pass --layouts")
    by_layout = {}  # layout -> the preset its reference run uses
    for layout in layouts:  # every mistake is reported before anything starts
        by_layout[layout] = resolve(config_for(layout, args.nproc, args.steps), args.nproc).cfg.model.preset
    by_model = dict.fromkeys(by_layout.values())
    out = Path(args.out or tempfile.mkdtemp(prefix="shoal-verify-"))
    import torch

    from shoal.launch.local import worker_env
    from shoal.train.trainer import train

    # The reference gets the workers' threads: a different thread count splits sums differently
    # (tiny-moe's losses then differed by 2e-4; with one thread each they match to 1e-6).
    torch.set_num_threads(int(worker_env(args.nproc).get("OMP_NUM_THREADS", torch.get_num_threads())))
    console = make_console()
    for preset in by_model:  # the single-process references, in this process
        ref_cfg = config_for(f"model={preset},dp_shard=1", 1, args.steps, global_batch=4 * args.nproc)
        train(ref_cfg, out / f"reference-{preset}", show=False)
    console.print(f"reference runs done on 1 process; running {len(layouts)} layouts on {args.nproc} ranks ...")
    code = launch(["-m", "shoal.train.verify", str(out), str(args.nproc), str(args.steps), json.dumps(layouts)],
                  args.nproc)
    results = [compare(layout, out / f"layout{i}", out / f"reference-{by_layout[layout]}", args.tolerance)
               for i, layout in enumerate(layouts)]
    table = Table(title=f"parity vs 1 process ({args.steps} steps, fp32, tolerance {args.tolerance:g}; "
                        f"grad norm relative, weights at the end)")
    for col in ("layout", "max |loss diff|", "max grad-norm diff", "max weight diff", "final loss", "result"):
        table.add_column(col)
    for r in results:
        table.add_row(r.layout, f"{r.loss_diff:.2e}", f"{r.grad_diff:.2e}", f"{r.weight_diff:.2e}",
                      f"{r.final_loss:.6f}", "[green]pass" if r.passed else "[red]FAIL")
    console.print(table)
    for layout, reason in skipped:
        console.print(f"not run on {args.nproc} ranks: {layout} ({reason})")
    return 0 if code == 0 and all(r.passed for r in results) else 1
