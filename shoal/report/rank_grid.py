"""The rank grid: every rank on its node and device, one panel per kind of group (TP, CP, PP, DP, EP).

Ranks are numbered as shoal/parallel/mesh.py lays them out ([pp][dp_replicate][dp_shard][cp][tp],
tp innermost unless parallel.rank_order says otherwise) and placed on nodes in order, `per_node` to a node, as torchrun and Slurm place
them. Cells of one colour in a panel form one group; a group with ranks on two nodes talks over
the slower inter-node link, so its cells get a thick red border and the panel title names it.
"""

from __future__ import annotations

from pathlib import Path

from shoal.report.draw import pyplot, save

KINDS = ("tp", "cp", "pp", "dp", "ep")
TITLES = {"tp": "tensor parallel", "cp": "context parallel", "pp": "pipeline stages", "dp": "data parallel",
          "ep": "expert parallel"}


def grid_geometry(dims, per_node: int) -> dict:
    """What the picture shows, as data: places, groups, and the groups that cross a node."""
    per_node = max(1, min(per_node, dims.world_size))
    groups = {k: v for k, v in dims.groups().items() if k in KINDS}
    node_of = {r: r // per_node for r in range(dims.world_size)}
    crossing = {k: [g for g in gs if len({node_of[r] for r in g}) > 1] for k, gs in groups.items()}
    return {"world": dims.world_size, "per_node": per_node, "nodes": -(-dims.world_size // per_node),
            "place": {r: (node_of[r], r % per_node) for r in range(dims.world_size)},
            "groups": groups, "crossing": crossing,
            "coords": dict(enumerate(dims.all_coords()))}


def shown_kinds(dims) -> list[str]:
    sizes = {"tp": dims.tp, "cp": dims.cp, "pp": dims.pp, "dp": dims.dp, "ep": dims.ep}
    return [k for k in KINDS if sizes[k] > 1] or ["dp"]


def rank_grid_figure(dims, per_node: int, stem: Path, title: str = "", formats=("png", "svg"),
                     max_nodes: int = 4, max_devices: int = 32) -> list[Path]:
    """Draw the grid; a cluster bigger than max_nodes shows its first max_nodes nodes (the pattern repeats), and a
    node of more than max_devices its first max_devices (a TPU slice is one node of thousands of chips: drawing
    every one took minutes, 65,536 ranks on one node over two)."""
    from matplotlib.patches import Rectangle

    plt = pyplot()
    geo = grid_geometry(dims, per_node)
    kinds = shown_kinds(dims)
    nodes, cols = min(geo["nodes"], max_nodes), min(geo["per_node"], max_devices)
    cell_w = 1.35 if cols <= 8 else 0.9
    # one panel per kind, stacked: the same ranks in the same places, coloured by a different group
    fig, axes = plt.subplots(len(kinds), 1, figsize=(max(4.0, cols * cell_w + 1.0), (0.9 * nodes + 0.9) * len(kinds) + 0.4),
                             squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, kind in zip(axes[:, 0], kinds):
        group_of = {r: i for i, g in enumerate(geo["groups"][kind]) for r in g}
        cross = {r for g in geo["crossing"][kind] for r in g}
        for r, (node, dev) in geo["place"].items():
            if node >= nodes:
                break
            if dev >= cols:
                continue
            y = nodes - 1 - node
            ax.add_patch(Rectangle((dev + 0.06, y + 0.08), 0.88, 0.8, facecolor=cmap(group_of[r] % 20),
                                   edgecolor="#c0392b" if r in cross else "white", linewidth=3 if r in cross else 1))
            c = geo["coords"][r]
            ax.text(dev + 0.5, y + 0.6, f"rank {r}", ha="center", va="center", fontsize=8, weight="bold")
            ax.text(dev + 0.5, y + 0.3, f"{kind} group {group_of[r]}", ha="center", va="center", fontsize=6.5)
            if kind == "dp" and dims.tp * dims.pp * dims.cp > 1:
                where = f"tp{c['tp']} pp{c['pp']}" + (f" cp{c['cp']}" if dims.cp > 1 else "")
                ax.text(dev + 0.5, y + 0.14, where, ha="center", va="center", fontsize=5.5)
        for node in range(nodes):
            y = nodes - 1 - node
            ax.add_patch(Rectangle((0, y), cols, 0.96, fill=False, edgecolor="#555", linestyle="--", linewidth=0.8))
            ax.text(-0.08, y + 0.48, f"node {node}", ha="right", va="center", fontsize=7.5)
        n_groups = len(geo["groups"][kind])
        sub = f"{TITLES[kind]}: {n_groups} group{'s' * (n_groups > 1)} of {len(geo['groups'][kind][0])}"
        if geo["crossing"][kind]:
            sub += f"\n{len(geo['crossing'][kind])} cross a node (red)"
        if kind == kinds[0]:  # the headline sits above the first panel (a suptitle collides with it)
            parts = ([f"nodes 0-{nodes - 1}"] if nodes < geo["nodes"] else []) + (
                [f"devices 0-{cols - 1}"] if cols < geo["per_node"] else [])
            shown = f" ({' and '.join(parts)} shown)" if parts else ""
            sub = (title or f"{dims.world_size} ranks on {geo['nodes']} node{'s' * (geo['nodes'] > 1)} x "
                            f"{geo['per_node']} devices{shown}") + "\n" + sub
        ax.set_title(sub, fontsize=9)
        ax.set_xlim(-0.9, cols + 0.05)
        ax.set_ylim(-0.05, nodes + 0.05)
        ax.set_aspect("equal")
        ax.axis("off")
    return save(fig, stem, formats)
