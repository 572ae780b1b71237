"""The rank grid: ParallelDims -> one DeviceMesh with named axes.

Ranks are laid out as `arange(world).view(pp, dp_replicate, dp_shard, tp)`: tp innermost, so a
tensor-parallel group is made of neighbouring ranks (one machine), pp outermost. Expert
parallelism borrows ranks from dp_shard: dp_shard is split into (dp_shard // ep, ep), and the ep
ranks that share a (pp, dp_replicate, dp_shard // ep, tp) coordinate exchange tokens.
This module checks everything that can be checked without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.errors import UserError
from shoal.model.config import ModelConfig

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    ep: int
    world_size: int

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.tp)

    def grid(self):
        """Global rank at each (pp, dp_replicate, dp_shard, tp) coordinate, as a numpy array."""
        import numpy as np

        return np.arange(self.world_size).reshape(self.shape)

    def groups(self) -> dict[str, list[list[int]]]:
        """The rank groups of each kind, as lists of global ranks."""
        import numpy as np

        g = self.grid()

        def along(axes: tuple[int, ...]) -> list[list[int]]:
            keep = [a for a in range(4) if a not in axes]
            moved = np.transpose(g, keep + list(axes)).reshape(-1, int(np.prod([g.shape[a] for a in axes])))
            return moved.tolist()

        groups = {"tp": along((3,)), "pp": along((0,)), "dp": along((1, 2))}
        if self.ep > 1:
            e = g.reshape(self.pp, self.dp_replicate, self.dp_shard // self.ep, self.ep, self.tp)
            groups["ep"] = np.moveaxis(e, 3, -1).reshape(-1, self.ep).tolist()
        return groups

    def coords(self, rank: int) -> dict[str, int]:
        pp, dr, ds, tp = (int(i) for i in divmod_all(rank, self.shape))
        return {"pp": pp, "dp_replicate": dr, "dp_shard": ds, "tp": tp, "dp": dr * self.dp_shard + ds}


def divmod_all(rank: int, shape: tuple[int, ...]) -> list[int]:
    out = []
    for size in reversed(shape):
        rank, r = divmod(rank, size)
        out.append(r)
    return list(reversed(out))


def _factorizations(world: int) -> str:
    """A few tp x pp x dp factorizations of world, as a hint."""
    options = [f"tp={tp} pp={pp} dp={world // (tp * pp)}"
               for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) if world % (tp * pp) == 0]
    return "; ".join(options[:6])


def resolve_dims(par, world_size: int, model: ModelConfig, *, global_batch: int, micro_batch: int) -> ParallelDims:
    """Fill dp_shard=-1 and validate the layout against the world size and the model."""
    for name in ("dp_replicate", "tp", "pp", "ep", "pp_virtual_stages"):
        if getattr(par, name) < 1:
            raise UserError(f"parallel.{name}", getattr(par, name), "must be a positive integer")
    fixed = par.dp_replicate * par.tp * par.pp
    dp_shard = par.dp_shard
    if dp_shard == -1:
        if world_size % fixed:
            raise UserError("parallel", f"dp_replicate*tp*pp={fixed}",
                            f"does not divide the world size {world_size}; options: {_factorizations(world_size)}")
        dp_shard = world_size // fixed
    if dp_shard < 1 or fixed * dp_shard != world_size:
        raise UserError("parallel.dp_shard", par.dp_shard,
                        f"dp_replicate*dp_shard*tp*pp={fixed * max(dp_shard, 0)} but the world size is {world_size}; "
                        f"use dp_shard=-1 or one of: {_factorizations(world_size)}")
    dims = ParallelDims(par.dp_replicate, dp_shard, par.tp, par.pp, par.ep, world_size)
    m = model
    if m.n_heads % dims.tp or m.n_kv_heads % dims.tp:
        raise UserError("parallel.tp", dims.tp, f"must divide n_heads={m.n_heads} and n_kv_heads={m.n_kv_heads}")
    for name in ("ffn_hidden", "vocab_size"):
        if getattr(m, name) % dims.tp:
            raise UserError("parallel.tp", dims.tp, f"must divide model.{name}={getattr(m, name)}")
    if dims.tp > 1 and m.is_moe:
        raise UserError("parallel.tp", dims.tp, "tensor parallelism of MoE layers is not supported yet; use parallel.ep")
    if par.zero not in (0, 1, 2, 3):
        raise UserError("parallel.zero", par.zero, "use 0, 1, 2 or 3")
    if par.zero == 1 and dims.dp == 1:
        raise UserError("parallel.zero", 1, "ZeRO-1 shards the optimizer over data-parallel ranks but dp=1; use zero=0 "
                        "or give data parallelism ranks (parallel.dp_shard)")
    if dims.ep > 1:
        if not m.is_moe:
            raise UserError("parallel.ep", dims.ep, "expert parallelism needs an MoE model (model.n_experts > 0)")
        if dims.dp_shard % dims.ep or m.n_experts % dims.ep:
            raise UserError("parallel.ep", dims.ep,
                            f"must divide dp_shard={dims.dp_shard} (ep borrows data-parallel ranks) and n_experts={m.n_experts}")
        if par.zero == 1:
            raise UserError("parallel.zero", 1, "expert parallelism needs zero=0, 2 or 3")
    if par.pp_schedule not in SCHEDULES:
        raise UserError("parallel.pp_schedule", par.pp_schedule, f"use one of {', '.join(SCHEDULES)}")
    stages = dims.pp * virtual_stages(par)
    if stages > m.n_layers:
        raise UserError("parallel.pp", dims.pp, f"{stages} pipeline stages but only n_layers={m.n_layers}")
    if dims.pp > 1 and m.tie_embeddings:
        raise UserError("model.tie_embeddings", True, "tied embeddings cannot span pipeline stages; set it false or pp=1")
    per_rank = global_batch // dims.dp if global_batch % dims.dp == 0 else 0
    if not per_rank or per_rank % micro_batch:
        raise UserError("train.global_batch", global_batch,
                        f"must be a multiple of micro_batch*dp = {micro_batch}*{dims.dp} = {micro_batch * dims.dp}")
    if dims.pp > 1:
        n_micro = par.pp_microbatches or per_rank // micro_batch
        if per_rank % n_micro:
            raise UserError("parallel.pp_microbatches", par.pp_microbatches,
                            f"must divide the {per_rank} sequences each data-parallel rank gets per step")
        if par.pp_schedule != "gpipe" and n_micro < dims.pp:
            raise UserError("parallel.pp_microbatches", n_micro,
                            f"{par.pp_schedule} needs at least pp={dims.pp} micro-batches per step to fill the pipeline; "
                            f"raise train.global_batch or lower train.micro_batch")
        if par.pp_schedule in ("interleaved-1f1b", "zero-bubble") and n_micro % dims.pp:
            raise UserError("parallel.pp_microbatches", n_micro, f"{par.pp_schedule} needs a multiple of pp={dims.pp}")
    return dims


def virtual_stages(par) -> int:
    """Stages per pipeline rank: 1 for gpipe/1f1b, pp_virtual_stages (at least 2) for the interleaved ones."""
    if par.pp_schedule in ("interleaved-1f1b", "zero-bubble"):
        return max(2, par.pp_virtual_stages)
    return 1


class Meshes:
    """A mesh indexed by axis names, as DeviceMesh is, with its flattened axes kept here: torch
    deprecates slicing a flattened axis back out of the root mesh."""

    def __init__(self, root, flattened: dict):
        self.root, self.flattened = root, flattened

    def __getitem__(self, names):
        return self.flattened[names] if names in self.flattened else self.root[names]


def build_mesh(dims: ParallelDims, device_type: str) -> tuple[Meshes, Meshes | None]:
    """The world mesh (pp, dp_replicate, dp_shard, tp) and, with ep > 1, the expert mesh that splits dp_shard."""
    from torch.distributed.device_mesh import init_device_mesh

    world = init_device_mesh(device_type, dims.shape, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
    world = Meshes(world, {"dp": world["dp_replicate", "dp_shard"]._flatten("dp")})
    expert = None
    if dims.ep > 1:
        expert = init_device_mesh(
            device_type, (dims.pp, dims.dp_replicate, dims.dp_shard // dims.ep, dims.ep, dims.tp),
            mesh_dim_names=("pp", "dp_replicate", "dp_shard_mod_ep", "ep", "tp"))
        expert = Meshes(expert, {"dp_mod_ep": expert["dp_replicate", "dp_shard_mod_ep"]._flatten("dp_mod_ep")})
    return world, expert
