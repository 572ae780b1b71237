"""This process's place in the job: process group, device, layout and the meshes.

One process (no launcher) gets a world of 1 and never touches torch.distributed collectives.
Under `shoal train --nproc N` or torchrun the usual environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT) is set and NCCL (CUDA) or gloo (CPU) is chosen automatically.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.config import JobConfig
from shoal.parallel.mesh import ParallelDims, build_mesh


@dataclass
class Runtime:
    rank: int
    world_size: int
    device: torch.device
    dims: ParallelDims
    mesh: object = None
    expert_mesh: object = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        return self.dims.coords(self.rank)["dp"]

    def global_mean(self, value: torch.Tensor) -> float:
        """Mean of a per-rank quantity known on the ranks that hold the last pipeline stage (0 elsewhere).

        Each (dp, cp, tp) coordinate has one such rank; tp ranks hold equal values and cp ranks
        shares whose mean is their sequences' (parallel/context_parallel.py), so the sum over the
        world divided by dp * cp * tp is the mean over data-parallel ranks.
        """
        if self.world_size == 1:
            return float(value)
        value = value.detach().clone().double()  # a float64 run (`shoal verify`) logs all its digits
        dist.all_reduce(value)
        return float(value) / (self.dims.dp * self.dims.cp * self.dims.tp)


def init_runtime(job) -> Runtime:
    """Join the job's process group (a shoal.job.Job resolved for this world size) and build its meshes."""
    world, dims = job.world, ParallelDims.of(job.layout)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    if world == 1:
        return Runtime(0, 1, device, dims)
    if not dist.is_initialized():  # Ray Train (shoal/launch/ray.py) makes the group itself: join that one
        # Offloaded parameters leave gradients (and their norm) on the host: gloo carries those.
        backend = "gloo" if not use_cuda else "cuda:nccl,cpu:gloo" if job.layout.offload != "none" else "nccl"
        dist.init_process_group(backend)
    assert dist.get_world_size() == world, (dist.get_world_size(), world)
    mesh, expert_mesh = build_mesh(dims, device.type)
    return Runtime(dist.get_rank(), world, device, dims, mesh, expert_mesh)


def enable_debugging(cfg: JobConfig, rt: Runtime) -> None:
    """The hang watchdog (and, when asked, the collective checker) on every rank of a multi-rank job."""
    if rt.world_size == 1:
        return
    import shoal.debug

    # DDP (zero=1) needs no watch_ddp here: apply_ddp already routes its all-reduce through Python.
    shoal.debug.enable(check_collectives=cfg.debug.check_collectives, hang_timeout_s=cfg.debug.hang_timeout_s)


def rank_stats(rt: Runtime, compute_time_s: float, memory: dict[str, float]) -> tuple[dict, dict[str, list]]:
    """One small all-gather per step of every rank's compute time and memory (bytes by kind):
    the spread across ranks with stragglers named (for metrics.jsonl), and {kind: [bytes per rank]}."""
    from shoal.debug.stragglers import gather_per_rank, judge_spread

    rows = gather_per_rank([compute_time_s, *memory.values()]) if rt.world_size > 1 else [[compute_time_s, *memory.values()]]
    spread = judge_spread([r[0] for r in rows]) if rt.world_size > 1 else {}
    by_rank = {kind: [None if v != v else int(v) for v in column]  # NaN: not measured on that rank
               for kind, column in zip(memory, zip(*(r[1:] for r in rows)))}
    return spread, by_rank


def group_labels(rt: Runtime) -> dict[str, str]:
    """Process-group name -> the parallel dimension(s) it carries ("tp", "dp_shard", "pp", "ep", ...),
    so bytes on the wire can be told by dimension. Dimensions that are the same ranks share a group
    (DeviceMesh hands a dimension spanning every rank the default group itself) and are joined:
    "dp_shard/ep" when experts span the whole data-parallel group. Flattened dimensions ("dp") name
    a group only when no single dimension does; "world" is the default group where none spans it."""
    if rt.world_size == 1:
        return {}
    labels: dict[str, str] = {}
    meshes = [m for m in (rt.mesh, rt.expert_mesh) if m is not None]
    for m in meshes:
        for name in m.root.mesh_dim_names:
            group = m.root.get_group(name).group_name
            if name not in labels.get(group, "").split("/"):
                labels[group] = f"{labels[group]}/{name}" if group in labels else name
    for m in meshes:
        for name, flat in m.flattened.items():
            labels.setdefault(flat.get_group().group_name, name)
    labels.setdefault(dist.group.WORLD.group_name, "world")
    return labels


def mark(step: int, phase: str) -> None:
    """Tell the hang watchdog where this rank is (two attribute writes; a no-op when it is off)."""
    import shoal.debug

    shoal.debug.progress(step, phase)


def require_shared(rt: Runtime, directory: Path, field: str) -> None:
    """Collective: one UserError, the same on every rank, when `directory` is not one directory for
    every node of the job (shoal/worker/shared_dir.py); every rank leaves the job first, together."""
    if rt.world_size < 2:
        return
    from shoal.worker.shared_dir import unshared_message, unshared_nodes

    problems = unshared_nodes(directory)
    if problems:
        shutdown()
        raise unshared_message(problems, field, directory)


def shutdown() -> None:
    """Leave the job together: say goodbye to the hang watchdogs while every rank (rank 0, which
    may host the store, included) is still there, then one barrier, so nobody's goodbye finds the
    store gone."""
    if dist.is_initialized():
        import shoal.debug

        shoal.debug.say_goodbye()
        dist.barrier()
        dist.destroy_process_group()
