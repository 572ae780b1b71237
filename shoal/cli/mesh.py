"""`shoal mesh --nproc N [RECIPE] [--set parallel.tp=2 ...] [--svg FILE]`: which global ranks form each group."""

from __future__ import annotations

from pathlib import Path

from shoal.cli.argtypes import nonnegative_int, positive_int


def register(sub) -> None:
    p = sub.add_parser("mesh", help="print the rank grid and the TP/PP/DP/EP groups of a layout")
    p.add_argument("recipe", nargs="?")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--nproc", type=positive_int, required=True, help="world size")
    p.add_argument("--svg", metavar="FILE", help="also draw the rank grid on its nodes into this SVG file")
    p.add_argument("--per-node", type=nonnegative_int, default=0, metavar="N",
                   help="ranks per node for --svg (default: all on one node)")
    p.set_defaults(func=run)


def print_groups(dims) -> None:
    print(f"world {dims.world_size} = pp {dims.pp} x dp_replicate {dims.dp_replicate} x dp_shard {dims.dp_shard} "
          f"x tp {dims.tp}" + (f"   (ep {dims.ep} inside dp_shard)" if dims.ep > 1 else ""))
    print("rank grid [pp][dp_replicate][dp_shard][tp]:")
    print(dims.grid())
    for kind, groups in dims.groups().items():
        print(f"{kind:>3} groups: " + "  ".join("[" + ",".join(map(str, g)) + "]" for g in groups))


def run(args) -> int:
    from shoal.config import load_config
    from shoal.errors import UserError
    from shoal.job import resolve

    dims = resolve(load_config(args.recipe, args.overrides), args.nproc).dims
    path = Path(args.svg) if args.svg else None
    if path and path.suffix.lower() != ".svg":
        raise UserError("--svg", args.svg, f"must name an .svg file, e.g. --svg {path.with_suffix('.svg')}")
    if args.per_node < 0:
        raise UserError("--per-node", args.per_node, "must be a positive number of ranks per node")
    print_groups(dims)
    if path:
        from shoal.report.rank_grid import rank_grid_figure

        print(f"rank grid: {rank_grid_figure(dims, args.per_node or dims.world_size, path.with_suffix(''), formats=('svg',))[0]}")
    return 0
