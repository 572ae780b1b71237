"""`shoal mesh --nproc N [RECIPE] [--set parallel.tp=2 ...]`: which global ranks form each group."""

from __future__ import annotations

from shoal.cli.argtypes import positive_int


def register(sub) -> None:
    p = sub.add_parser("mesh", help="print the rank grid and the TP/PP/DP/EP groups of a layout")
    p.add_argument("recipe", nargs="?")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--nproc", type=positive_int, required=True, help="world size")
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
    from shoal.job import resolve

    print_groups(resolve(load_config(args.recipe, args.overrides), args.nproc).dims)
    return 0
