"""Prepare a training job once, then start it.

`shoal train` is parse -> prepare -> start -> exit code (shoal/cli/train.py). `prepare` runs every
check a job can fail, once, in the process the user started, before any worker exists; it ends by
writing <out>/job.json, which the workers it starts read (`python -m shoal.train --job FILE`)
instead of a command line. Under plain torchrun there is no such process: each rank prepares
(`torchrun -m shoal.train RECIPE --out DIR`, shoal/train/__main__.py), rank 0 alone holds the lock,
checks the checkpoints and writes job.json, and nothing is started.

`start` hands the prepared job to one launcher: this process (no --nproc), PyTorch's elastic agent
(--nproc, --nnodes), replica groups (--replica-groups) or Ray (--launcher ray).
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shoal.config import JobConfig
from shoal.errors import UserError
from shoal.files import missing_parts
from shoal.job import Job, resolve
from shoal.rundir.folder import check_out, default_out, remove_if_untouched
from shoal.rundir.lock import claim, release
from shoal.rundir.names import JOB, replica_dir
from shoal.worker.env import local_world_size, world_size
from shoal.worker.exit_codes import USER_ERROR

if TYPE_CHECKING:
    from shoal.launch.multinode import NodePlan


WORKER = ["-m", "shoal.train"]
"""What each worker runs, as python's arguments (before its --job)."""


@dataclass(frozen=True)
class Options:
    """How to run a job: `shoal train`'s flags, or the few a torchrun worker takes."""

    out: str | None = None
    """--out; None: a fresh runs/<recipe>-<YYYYmmdd-HHMMSS>."""
    recipe: str | None = None
    """The recipe's path, for the name of a fresh --out."""
    resume: str = "auto"
    quiet: bool = False
    nproc: int = 0
    """Workers to start on this machine (per node with nnodes); 0: train in this process."""
    launcher: str = "local"
    max_restarts: int = 0
    replica_groups: int = 0
    nnodes: int = 1
    node_rank: int = 0
    master: str = ""
    ifname: str = ""
    rdzv_timeout: int = 120
    rdzv: str = "c10d"


@dataclass
class Session:
    job: Job
    out: Path
    options: Options
    nodes: NodePlan | None = None
    """This node's multi-node plan, None on one machine."""
    job_files: list[Path] = field(default_factory=list)
    """The job.json each group of workers reads (one per replica group; none under torchrun)."""
    exit_code: int | None = None
    """How start ended; a refusal the workers said (USER_ERROR) takes back what prepare made."""

    @property
    def starts_workers(self) -> bool:
        o = self.options
        return o.launcher == "ray" or o.nproc > 1 or self.nodes is not None or bool(o.replica_groups)


def forks_workers(o: Options, nodes: NodePlan | None) -> bool:
    """This process's elastic agent forks the workers (shoal/launch/local.py, multinode.py: _launch_workers), from
    the forkserver prepare starts early; Ray's workers, and each replica group's own launcher, start elsewhere."""
    return o.launcher == "local" and not o.replica_groups and (o.nproc > 1 or nodes is not None)


def under_torchrun() -> bool:
    """This process is one rank of a job another launcher started (torchrun, Slurm, Kubernetes)."""
    return "WORLD_SIZE" in os.environ


def speaks_for_the_run() -> bool:
    """The process that says what is said once and writes job.json: the one the user started, or rank 0."""
    return not under_torchrun() or os.environ.get("RANK", "0") == "0"


def plan_job(cfg: JobConfig, o: Options) -> tuple[Job, NodePlan | None]:
    """The checks that need no output folder, in order; (the job, this node's plan or None).
    `shoal train --print-mesh` stops after these."""
    from shoal.debug import env_settings
    from shoal.launch.multinode import check_world
    from shoal.launch.replica_groups import group_config

    # 1. SHOAL_* debug overrides: checked once here, not once per rank.
    env_settings(cfg.debug.check_collectives, cfg.debug.hang_timeout_s)
    # 2. The launcher's own flags, before the job: each names a flag the user typed.
    if o.launcher == "ray":
        _check_ray_flags(o)
    cfg = group_config(cfg, o.replica_groups, o.nnodes)  # a replica group trains its share of the batch
    if not under_torchrun():  # srun -n2 shoal train: two copies that would each train alone
        from shoal.launch.slurm import check_srun_copies

        check_srun_copies(o.nnodes)
    # 3. The job for its world size (--nproc, or the launcher's checked WORLD_SIZE; per node with
    #    --nnodes): every layout mistake in microseconds, before anything slow or on disk.
    per_node = world_size(o.nproc)
    check_world(o.nnodes, per_node)
    job = resolve(cfg, per_node * o.nnodes)
    # 4. A multi-node job's network: after the job, because it may wait for node 0 (--rdzv-timeout)
    #    and a typo in the recipe should not wait that long to be said.
    return job, _node_plan(o)


@contextmanager
def prepare(cfg: JobConfig, o: Options):
    """Check everything, lock --out and write job.json; yields the Session to start. A refusal
    anywhere is a UserError, and a refused run leaves --out as it found it."""
    job, nodes = plan_job(cfg, o)
    forked = forks_workers(o, nodes)
    if forked:
        from shoal.launch.local import prestart

        prestart(WORKER, o.nproc)  # the workers' forkserver imports torch beside the checks below
    try:
        with _checked(cfg, o, job, nodes) as session:
            yield session
    except UserError:
        if forked:
            from shoal.launch.forkserver_start import stop

            stop()  # refused: nothing will be forked from it
        raise


@contextmanager
def _checked(cfg: JobConfig, o: Options, job: Job, nodes: NodePlan | None):
    """prepare's checks once the job is planned: what only this machine, the corpus and --out can say."""
    local_ranks = o.nproc or local_world_size(1)
    # 5. Memory, predicted for the busiest rank, against this machine: before the corpus is read.
    if cfg.train.memory_check:
        from shoal.launch.memory_check import check_memory

        check_memory(job, local_ranks)
    # 5a. FP8 where this machine's GPU cannot multiply in it (CPU emulates: parallel/float8.py).
    if cfg.train.precision == "fp8":
        from shoal.launch.memory_check import check_fp8_device

        check_fp8_device()
    if speaks_for_the_run():
        _warn_placement(job, local_ranks)
    # 5b. A pretrained folder's tensors: every name and shape, from the files' headers alone.
    if cfg.model.init_from:
        from shoal.checkpoint.pretrained import open_weights

        open_weights(cfg.model.init_from, job.model)
    # 6. The corpus, tokenized here, once, before any worker starts: data mistakes are one line from
    #    this process, and the workers find the cache. Under torchrun each rank builds its own.
    if not under_torchrun():
        from shoal.train.data import build_data

        if ran_out := build_data(job).loader.exhausted():
            raise UserError("data.repeat", False, f"{ran_out} holds fewer sequences of train.seq_len tokens than one "
                                                  "global batch; set data.repeat=true or use more data")
    if job.cfg.train.compile:
        _check_compiler()
    # 7. The output folder: its checks create nothing until they pass, then the lock (one live run
    #    per folder), then what needs the lock: whether the checkpoints there can be resumed.
    out = _out(o)
    made = missing_parts(out)  # what a refusal below must take away again
    out = check_out(str(out), _corpus_folders(job.cfg))
    holder = (nodes is None or nodes.node_rank == 0) and claim(out)  # node 0 holds a multi-node run's lock
    try:
        session = Session(job, out, o, nodes)
        _check_resume(session)
        if o.out is None:
            print(f"shoal: writing to {out} (choose with --out)", file=sys.stderr, flush=True)
        # 8. job.json, last: what the workers read instead of a command line.
        if speaks_for_the_run():
            warn_ignored(cfg)  # after every refusal: a refused run's one line stays one line
            session.job_files = [job.save(replica_dir(out, g) / JOB, out=replica_dir(out, g), resume=o.resume,
                                          show=not o.quiet) for g in range(max(1, o.replica_groups))]
        yield session
        if session.exit_code == USER_ERROR and not under_torchrun():  # a worker refused it (NaN weights)
            remove_if_untouched(out, made)
    except UserError:
        if not under_torchrun():  # the process the user started; never under another rank's feet
            remove_if_untouched(out, made)
        raise
    finally:
        if holder:
            release(out)


def start(session: Session) -> int:
    """Run the prepared job; returns its exit code (shoal/worker/exit_codes.py)."""
    session.exit_code = _start(session)
    return session.exit_code


def _start(session: Session) -> int:
    from shoal.train.process import train_here
    from shoal.worker.streams import forgive_closed_output

    forgive_closed_output()  # the launcher's lines too: a closed stdout never stops a run
    o, job, out = session.options, session.job, session.out
    if o.launcher == "ray":
        from shoal.launch.ray import launch

        return launch(job, out, o.nproc, resume=o.resume, show=not o.quiet)
    if not session.starts_workers:
        return train_here(job, out, resume=o.resume, show=not o.quiet)
    return _launch_workers(session)


def _launch_workers(session: Session) -> int:
    from functools import partial

    from shoal.checkpoint.choose import checkpoint_root
    from shoal.launch.local import launch
    from shoal.train import preempt
    from shoal.worker.exit_codes import SAID_WHY

    o, nodes = session.options, session.nodes
    workers = [[*WORKER, "--job", str(path)] for path in session.job_files]
    if o.replica_groups:
        from shoal.launch.replica_groups import launch_groups

        return launch_groups(workers, max(o.nproc, 1), o.max_restarts)
    on_sigterm = partial(preempt.exit_code_after, checkpoint_root(session.job.cfg, session.out), o.nproc * o.nnodes,
                         session.out, time.time())
    if nodes:
        from shoal.launch.multinode import launch_nodes

        return launch_nodes(workers[0], o.nproc, nodes, max_restarts=o.max_restarts, said_why=SAID_WHY,
                            on_sigterm=on_sigterm)
    return launch(workers[0], o.nproc, max_restarts=o.max_restarts, said_why=SAID_WHY, on_sigterm=on_sigterm)


def _out(o: Options) -> Path:
    """--out, or a fresh directory per run, so a run never silently replaces the previous one."""
    if o.out is not None:
        return Path(o.out)
    if under_torchrun():  # each rank (and each restart) would pick its own timestamp
        raise UserError("--out", "(not given)", "under torchrun every rank must write the same directory: "
                        "pass --out DIR")
    return default_out(o.recipe)  # said once the checks have passed: a refusal is one line


def _check_resume(session: Session) -> None:
    """--resume mistakes against the checkpoints in --out (and in each replica group's folder)."""
    from shoal.checkpoint.choose import check_resume

    for group in range(max(1, session.options.replica_groups)):
        folder = replica_dir(session.out, group)
        check_resume(session.job.cfg, folder if group == 0 else check_out(str(folder)), session.options.resume)


def _corpus_folders(cfg: JobConfig) -> tuple[str, ...]:
    from shoal.data.corpus import data_paths
    from shoal.data.sources import STDLIB

    return tuple(p for p in data_paths(cfg.data) if p != STDLIB)


def _check_compiler() -> None:
    import torch

    from shoal.parallel.compile import check_compiler

    check_compiler("cuda" if torch.cuda.is_available() else "cpu")


def _check_ray_flags(o: Options) -> None:
    """--launcher ray: Ray places the workers on its nodes and restarts nothing; refuse flags it would ignore."""
    from shoal.launch.ray import require_ray

    for flag, value, unset in (("--nnodes", o.nnodes, 1), ("--node-rank", o.node_rank, 0),
                               ("--master", o.master, ""), ("--max-restarts", o.max_restarts, 0)):
        if value != unset:
            raise UserError(flag, value, "is for --launcher local; with --launcher ray leave it out (Ray places "
                                         "the workers; rerun to resume from the last checkpoint)")
    if o.nproc < 1:
        raise UserError("--nproc", o.nproc, "give the number of Ray workers with --launcher ray, e.g. --nproc 2")
    require_ray()


def _node_plan(o: Options) -> NodePlan | None:
    """The multi-node plan for --nnodes > 1 (None for one machine), its network checked."""
    from shoal.launch.multinode import multinode, plan_node

    if not multinode(o.nnodes, o.node_rank, o.master, o.ifname, o.rdzv_timeout, o.rdzv):
        return None
    if under_torchrun():
        raise UserError("--nnodes", o.nnodes, "is for starting workers; under torchrun (WORLD_SIZE is set) "
                                              "leave out --nnodes/--master")
    if o.nproc < 1:
        raise UserError("--nproc", o.nproc, "give the workers per node with --nnodes, e.g. --nproc 8")
    if o.out is None:  # each node would pick its own timestamped directory
        raise UserError("--out", "(not given)", "with --nnodes every node must write the same directory, on a "
                                                "filesystem they share: pass --out DIR")
    return plan_node(o.nnodes, o.node_rank, o.master, o.ifname, o.rdzv_timeout, o.rdzv)


def warn_ignored(cfg: JobConfig) -> None:
    """The settings the layout leaves without effect, one warning line each (the job runs without them)."""
    import dataclasses

    from shoal.setting_rules import ignored_settings

    def fields(c: JobConfig) -> dict:  # setting_rules.ENABLED_BY's names: parallel's bare, the others dotted
        return dataclasses.asdict(c.parallel) | {f"{section}.{k}": v for section in ("checkpoint", "train")
                                                  for k, v in dataclasses.asdict(getattr(c, section)).items()}

    for line in ignored_settings(fields(cfg), fields(JobConfig())):
        print(f"shoal: warning: {line}", file=sys.stderr, flush=True)


def _warn_placement(job: Job, per_node: int) -> None:
    from shoal.parallel.mesh import ParallelDims, placement_warning

    if line := placement_warning(ParallelDims.of(job.layout), per_node):
        print(line, file=sys.stderr, flush=True)
