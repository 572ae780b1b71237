"""The rank grid: ParallelDims -> one DeviceMesh with named axes.

By default ranks are laid out as `arange(world).view(pp, dp_replicate, dp_shard, cp, tp)`: tp
innermost, so a tensor-parallel group is made of neighbouring ranks (one machine), then context
parallel, pp outermost. `parallel.rank_order` reorders the dimensions (e.g. dp-tp-pp:
`arange(world).view(pp, cp, tp, dp_replicate, dp_shard)`, cp staying just outside tp unless the
order names it); the mesh keeps its axes in the order above and only which rank sits at each
coordinate changes, so nothing downstream of the mesh knows the order. cp ranks hold the same
parameters: gradients are reduced over dp x cp (the flattened "dp_cp" and "dp_shard_cp" axes). Expert
parallelism borrows ranks from dp_shard: dp_shard is split into (dp_shard // ep, ep), and the ep
ranks that share a (pp, dp_replicate, dp_shard // ep, tp) coordinate exchange tokens.
The rules a layout must follow live in shoal/layout_rules.py; this module only lays out ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.layout import DEFAULT_RANK_ORDER, rank_dims

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The mesh's axes, outermost first (whatever the rank order)."""


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    ep: int
    world_size: int
    rank_order: str = DEFAULT_RANK_ORDER
    """tp, dp, pp (and cp, if named) innermost first (shoal/layout_rules.py checks it)."""
    cp: int = 1
    """Context parallel, last so that positional construction keeps its meaning."""

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    @classmethod
    def of(cls, layout) -> "ParallelDims":
        """The grid of a checked shoal.layout.Layout."""
        return cls(layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp, layout.ep, layout.world,
                   layout.rank_order, layout.cp)

    def grid(self):
        """Global rank at each (pp, dp_replicate, dp_shard, cp, tp) coordinate, as a numpy array."""
        import numpy as np

        size = dict(zip(AXES, self.shape))
        # Number the ranks with the order's outermost dimension slowest, then view them on the mesh's axes.
        outer_first = [a for d in reversed(rank_dims(self.rank_order)) for a in ORDERED_AXES[d]]
        ranks = np.arange(self.world_size).reshape([size[a] for a in outer_first])
        return ranks.transpose([outer_first.index(a) for a in AXES])

    def shown_grid(self) -> tuple[tuple[str, ...], object]:
        """(axes, grid) as `shoal mesh` shows them: without the cp axis when cp == 1."""
        if self.cp > 1:
            return AXES, self.grid()
        return tuple(a for a in AXES if a != "cp"), self.grid().squeeze(AXES.index("cp"))

    def groups(self) -> dict[str, list[list[int]]]:
        """The rank groups of each kind, as lists of global ranks."""
        import numpy as np

        g = self.grid()

        def along(axes: tuple[int, ...]) -> list[list[int]]:
            keep = [a for a in range(g.ndim) if a not in axes]
            moved = np.transpose(g, keep + list(axes)).reshape(-1, int(np.prod([g.shape[a] for a in axes])))
            return moved.tolist()

        groups = {"tp": along((4,)), "pp": along((0,)), "dp": along((1, 2))}
        if self.cp > 1:
            groups["cp"] = along((3,))
        if self.ep > 1:
            e = g.reshape(self.pp, self.dp_replicate, self.dp_shard // self.ep, self.ep, self.cp, self.tp)
            groups["ep"] = np.moveaxis(e, 3, -1).reshape(-1, self.ep).tolist()
        return groups

    def coords(self, rank: int) -> dict[str, int]:
        return self.all_coords()[rank]

    def all_coords(self) -> list[dict[str, int]]:
        """Every rank's coordinates, by rank, from one sort of the grid (searching the grid once per rank
        took minutes for a 65,536-rank picture)."""
        import numpy as np

        g = self.grid()
        at = np.unravel_index(np.argsort(g, axis=None), g.shape)  # rank r sits at (at[0][r], ..., at[4][r])
        return [{"pp": int(pp), "dp_replicate": int(dr), "dp_shard": int(ds), "cp": int(cp), "tp": int(tp),
                 "dp": int(dr) * self.dp_shard + int(ds)} for pp, dr, ds, cp, tp in zip(*at)]


# The mesh axes each rank_order name stands for, outermost first: dp_shard varies fastest inside dp,
# so HSDP's shard groups are neighbours and its replicas are further apart.
ORDERED_AXES = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp_replicate", "dp_shard"), "pp": ("pp",)}


class Meshes:
    """A mesh indexed by axis names, as DeviceMesh is, with its flattened axes kept here: torch
    deprecates slicing a flattened axis back out of the root mesh."""

    def __init__(self, root, flattened: dict):
        self.root, self.flattened = root, flattened

    def __getitem__(self, names):
        return self.flattened[names] if names in self.flattened else self.root[names]


def build_mesh(dims: ParallelDims, device_type: str) -> tuple[Meshes, Meshes | None]:
    """The world mesh (pp, dp_replicate, dp_shard, cp, tp) and, with ep > 1, the expert mesh that splits dp_shard.
    With cp > 1 the axes gradients are reduced over are flattened too: dp_cp (dp_replicate, dp_shard,
    cp) and dp_shard_cp (dp_shard, cp).

    DeviceMesh is given the grid itself (init_device_mesh would number ranks in the default order only)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    grid = torch.as_tensor(dims.grid().copy())  # contiguous: DeviceMesh and reshape need it
    world = DeviceMesh(device_type, grid, mesh_dim_names=AXES)
    flat = {"dp": world["dp_replicate", "dp_shard"]._flatten("dp")}
    if dims.cp > 1:
        flat["dp_cp"] = world["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
        flat["dp_shard_cp"] = world["dp_shard", "cp"]._flatten("dp_shard_cp")
    world = Meshes(world, flat)
    expert = None
    if dims.ep > 1:  # layout_rules.py keeps ep and cp apart (cp=1 here)
        expert = DeviceMesh(
            device_type, grid.reshape(dims.pp, dims.dp_replicate, dims.dp_shard // dims.ep, dims.ep, dims.tp),
            mesh_dim_names=("pp", "dp_replicate", "dp_shard_mod_ep", "ep", "tp"))
        expert = Meshes(expert, {"dp_mod_ep": expert["dp_replicate", "dp_shard_mod_ep"]._flatten("dp_mod_ep")})
    return world, expert


# Nodes. Every launcher shoal uses (torchrun's c10d rendezvous, Slurm's srun + torchrun, Kubernetes
# with PET_* flags) gives each node one contiguous block of ranks, so rank r runs on node
# r // per_node as local device r % per_node. With tp innermost in the grid (the default
# rank_order), a TP group stays inside a node whenever tp divides the ranks per node; dp and pp,
# outermost, are what cross.

def node_of(rank: int, per_node: int) -> int:
    return rank // per_node


def crosses_nodes(group: list[int], per_node: int) -> bool:
    return len({node_of(r, per_node) for r in group}) > 1


def split_groups(dims: ParallelDims, per_node: int) -> dict[str, list[list[int]]]:
    """The groups of each kind that span more than one node (kinds with none are left out)."""
    out = {}
    for kind, groups in dims.groups().items():
        crossing = [g for g in groups if crosses_nodes(g, per_node)]
        if crossing:
            out[kind] = crossing
    return out


# Groups whose traffic is on the critical path of every layer: across the inter-node link they
# slow each step (tp: activations each layer; ep: tokens in and out of each MoE layer).
# (Not cp: its per-layer key/value gathers cross nodes by design at long context, Llama 3's CP 16.)
LATENCY_BOUND = {"tp": "tensor parallelism exchanges activations in every layer",
                 "ep": "expert parallelism sends tokens to and from every MoE layer"}


def placement_warning(dims: ParallelDims, per_node: int) -> str:
    """One line when a TP or EP group spans nodes ('' otherwise)."""
    if per_node < 1 or per_node >= dims.world_size:
        return ""
    split = {k: g for k, g in split_groups(dims, per_node).items() if k in LATENCY_BOUND}
    if not split:
        return ""
    kind, groups = next(iter(split.items()))
    size = len(groups[0])
    return (f"shoal: warning: {kind} groups span nodes ({kind}={size} with {per_node} ranks per node, e.g. "
            f"[{','.join(map(str, groups[0]))}]): {LATENCY_BOUND[kind]}, here over the slow inter-node link; "
            f"choose {kind} and the ranks per node so each group fits in one node"
            + (f", or the default parallel.rank_order={DEFAULT_RANK_ORDER}" if dims.rank_order != DEFAULT_RANK_ORDER else "")
            + " (see shoal mesh --nnodes)")
