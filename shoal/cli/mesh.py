"""`shoal mesh --nproc N [RECIPE] [--set parallel.tp=2 ...] [--svg FILE]`: which global ranks form each group.

With --nnodes and --nproc-per-node (or --nproc and --per-node) it also shows where each rank runs
(node, local device) and marks the groups that cross a node (the rule is in shoal/parallel/mesh.py).
"""

from __future__ import annotations

from pathlib import Path

from shoal.cli.argtypes import non_empty, nonnegative_int, positive_int
from shoal.files import check_output_file


def register(sub) -> None:
    p = sub.add_parser("mesh", help="print the rank grid and the TP/CP/PP/DP/EP groups of a layout")
    p.add_argument("recipe", nargs="?", type=non_empty("recipes/debug.toml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--nproc", type=nonnegative_int, default=0, help="world size (or give --nnodes and --nproc-per-node)")
    p.add_argument("--nnodes", type=positive_int, default=1, help="machines; ranks are placed in one block per node")
    # 0 is "not given" only as the default: typed, it read as such and the error named --nproc instead
    p.add_argument("--nproc-per-node", "--per-node", dest="per_node", type=positive_int, default=0, metavar="N",
                   help="ranks (devices) per node (default: all on one node)")
    p.add_argument("--svg", metavar="FILE", type=non_empty("--svg mesh.svg"),
                   help="also draw the rank grid on its nodes into this SVG file")
    p.add_argument("--json", action="store_true", help="print one JSON object: the grid, every group, the placement")
    p.set_defaults(func=run)


def print_groups(dims, per_node: int = 0) -> None:
    """The grid and its groups; with per_node, the rank -> node -> device map and '*' on groups that cross nodes."""
    from shoal.layout import rank_dims
    from shoal.parallel.mesh import crosses_nodes

    per_node = per_node if 0 < per_node < dims.world_size else 0
    axes, grid = dims.shown_grid()
    print(f"world {dims.world_size} = " + " x ".join(f"{a} {getattr(dims, a)}" for a in axes)
          + (f"   (ep {dims.ep} inside dp_shard)" if dims.ep > 1 else "")
          + f"   rank order {'-'.join(rank_dims(dims.rank_order)) if dims.cp > 1 else dims.rank_order} (innermost first)")
    print(f"rank grid [{']['.join(axes)}]:")
    print(grid)
    if per_node:
        nodes = dims.world_size // per_node
        print(f"placement: {nodes} nodes x {per_node} ranks, one block of ranks per node")
        for node in _elided(range(nodes)):
            if node == "...":
                print(f"  ... {nodes - 2 * SHOWN:,} nodes placed the same way ...")
                continue
            ranks = range(node * per_node, (node + 1) * per_node)
            print(f"  node {node}: " + "  ".join(f"rank {r} -> device {r % per_node}" for r in _elided(ranks)))
    for kind, groups in dims.groups().items():
        cells = []
        for g in _elided(groups):
            if g == "...":
                cells.append(f"... {len(groups) - 2 * SHOWN:,} more ...")
                continue
            mark = "*" if per_node and crosses_nodes(g, per_node) else ""
            cells.append("[" + ",".join(map(str, _elided(g))) + "]" + mark)
        print(f"{kind:>3} groups: " + "  ".join(cells))
    if per_node:
        print("  * crosses nodes: its traffic uses the inter-node link")


SHOWN = 8
"""A long list prints its first and last SHOWN items: a 100k-rank mesh stays a page, not 600 kB."""


def _elided(items):
    """`items`, or its first and last SHOWN with "..." between."""
    return list(items) if len(items) <= 2 * SHOWN else [*items[:SHOWN], "...", *items[-SHOWN:]]


def world_and_per_node(nproc: int, nnodes: int, per_node: int) -> tuple[int, int]:
    """(world size, ranks per node) from the flags, refusing ones that disagree."""
    from shoal.errors import UserError

    if nproc and per_node:
        if nproc % per_node:
            raise UserError("--nproc-per-node", per_node, f"must divide the world size --nproc {nproc}")
        if nnodes > 1 and nnodes * per_node != nproc:
            raise UserError("--nproc", nproc, f"is the world size; --nnodes {nnodes} x --nproc-per-node {per_node} = "
                                              f"{nnodes * per_node}: drop --nproc or make them agree")
        return nproc, per_node
    if per_node:
        return nnodes * per_node, per_node
    if nproc:
        if nproc % nnodes:
            raise UserError("--nnodes", nnodes, f"must divide the world size --nproc {nproc}, or give --nproc-per-node")
        return nproc, nproc // nnodes
    raise UserError("--nproc", nproc, "give the world size, or --nnodes and --nproc-per-node")


def run(args) -> int:
    import sys

    from shoal.config import load_config
    from shoal.errors import UserError
    from shoal.job import resolve
    from shoal.layout import MAX_GPUS
    from shoal.parallel.mesh import ParallelDims, placement_warning

    world, per_node = world_and_per_node(args.nproc, args.nnodes, args.per_node)
    if world > MAX_GPUS:  # resolve's bound too, said here in this command's flag: grouping 100M ranks takes minutes
        raise UserError("--nproc", world, f"is the world size; at most {MAX_GPUS:,} (a typo?)")
    path = Path(args.svg) if args.svg else None
    if path and path.suffix.lower() != ".svg":
        raise UserError("--svg", args.svg, f"must name an .svg file, e.g. --svg {path.with_suffix('.svg')}")
    if path:
        from shoal.report.draw import SVG_CREATOR

        check_output_file("--svg", args.svg, replaces=SVG_CREATOR)  # an earlier grid is redrawn, nothing else
    dims = ParallelDims.of(resolve(load_config(args.recipe, args.overrides), world).layout)
    warning = placement_warning(dims, per_node)
    drawn = None
    if path:
        from shoal.report.rank_grid import rank_grid_figure

        drawn = rank_grid_figure(dims, per_node, path.with_suffix(""), formats=("svg",))[0]
    if args.json:
        from shoal.cli.console import print_json

        print_json(mesh_json(dims, per_node, warning, drawn), indent=None)  # a million ranks: no line per rank
        return 0
    print_groups(dims, per_node)
    if warning:
        print(warning, file=sys.stderr)
    if drawn:
        print(f"rank grid: {drawn}")
    return 0


def mesh_json(dims, per_node: int, warning: str, svg) -> dict:
    """The grid as `arange(world)` viewed as [pp][dp_replicate][dp_shard][tp] ([pp][dp_replicate][dp_shard]
    [cp][tp] with context parallelism), every group of each kind (global ranks), and with ranks per
    node the groups that cross a node."""
    from shoal.parallel.mesh import split_groups

    placed = 0 < per_node < dims.world_size
    axes, grid = dims.shown_grid()
    return {"world": dims.world_size, "rank_order": dims.rank_order,
            "shape": {a: getattr(dims, a) for a in axes},
            "ep": dims.ep, "grid": grid.tolist(), "groups": dims.groups(),
            "per_node": per_node if placed else dims.world_size,
            "crossing_nodes": split_groups(dims, per_node) if placed else {},
            "warning": warning or None, "svg": str(svg) if svg else None}
