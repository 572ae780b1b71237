"""`shoal train [RECIPE.toml] [--set section.key=value ...] [--out DIR] [--nproc N]`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from shoal.cli.argtypes import non_empty, nonnegative_int
from shoal.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model (no recipe: the CPU demo)")
    p.add_argument("recipe", nargs="?", type=non_empty("recipes/debug.toml"),
                   help="TOML recipe (see recipes/); default: the demo settings")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config field, e.g. --set train.steps=50 (repeatable)")
    p.add_argument("--out", default=None, help="output directory (metrics.jsonl, checkpoints/, model/), one per run; "
                                               "default: a new runs/<recipe>-<YYYYmmdd-HHMMSS>")
    p.add_argument("--nproc", type=nonnegative_int, default=0,
                   help="start this many workers (see --launcher); 0: run in this process")
    p.add_argument("--launcher", choices=("local", "ray"), default="local",
                   help="who starts the --nproc workers: local (PyTorch's elastic launcher) or ray (Ray Train's "
                        "TorchTrainer, on the Ray cluster at RAY_ADDRESS or a private one; pip install 'shoal[ray]')")
    p.add_argument("--max-restarts", type=nonnegative_int, default=0,
                   help="when a worker dies, restart all workers from the last checkpoint, up to this many times")
    p.add_argument("--replica-groups", type=nonnegative_int, default=0, metavar="N",
                   help="N replica groups of --nproc workers each (needs torchft): a group whose worker dies "
                        "leaves, the others keep stepping, and it rejoins from a live peer's state")
    p.add_argument("--resume", default="auto", metavar="auto|never|PATH", type=non_empty("--resume auto"),
                   help="auto: continue from the newest intact checkpoint if there is one (default); never: start "
                        "over (refused if checkpoints exist); PATH: a checkpoint directory to start from, any layout")
    p.add_argument("--print-mesh", action="store_true", help="print the rank groups of the layout and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar, summary or sample")
    from shoal.launch.multinode import add_args

    add_args(p)  # --nnodes, --node-rank, --master, --ifname, --rdzv-timeout
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.checkpoint.choose import check_resume
    from shoal.config import load_config
    from shoal.debug import env_settings
    from shoal.job import resolve
    from shoal.launch.env import world_size
    from shoal.launch.replica_groups import group_config
    from shoal.train import rundir
    from shoal.train.memory_check import CHECKED_ENV, check_memory, local_world_size

    cfg = load_config(args.recipe, args.overrides)  # every user mistake surfaces here, before any work
    env_settings(cfg.debug.check_collectives, cfg.debug.hang_timeout_s)  # SHOAL_* overrides: once, not per rank
    if args.launcher == "ray":
        _check_ray_flags(args)
    cfg = group_config(cfg, args.replica_groups, args.nnodes)  # a replica group trains its share of the batch
    if "WORLD_SIZE" not in os.environ:  # srun -n2 shoal train: two copies that would each train alone
        from shoal.launch.slurm import check_srun_copies

        check_srun_copies(args.nnodes)
    # --nproc, or the launcher's WORLD_SIZE (checked with RANK & co); with --nnodes, --nproc is per node
    job = resolve(cfg, world_size(args.nproc) * args.nnodes)
    nodes = _node_plan(args)  # a multi-node job's network, checked before any worker starts
    if args.print_mesh:
        from shoal.cli.mesh import print_groups

        print_groups(job.dims)
        return 0
    if cfg.train.memory_check and not os.environ.get(CHECKED_ENV):  # the launcher's workers skip it
        check_memory(job, local_world_size(args.nproc))
    if not os.environ.get(CHECKED_ENV) and os.environ.get("RANK", "0") == "0":  # said once: launcher or rank 0
        _warn_placement(job, local_world_size(args.nproc))
    from shoal.train.trainer import build_data

    if "WORLD_SIZE" not in os.environ:  # data mistakes too: in the process the user started, before
        build_data(job)                  # any worker starts or --out is made (workers build their own)
    if cfg.train.compile:
        import torch

        from shoal.parallel.compile import check_compiler

        check_compiler("cuda" if torch.cuda.is_available() else "cpu")
    out = _out(args)
    made = _missing(Path(out) / rundir.LOCK)  # what a refusal below must take away again
    out = rundir.check_out(out, cfg.data.path)
    holder = not nodes or nodes.node_rank == 0  # node 0's launcher holds the lock of a multi-node run
    if holder:
        rundir.claim(out)  # one live run per directory, held by the launcher if there is one
    try:
        check_resume(cfg, out, args.resume)
        if args.out is None:
            print(f"shoal: writing to {out} (choose with --out)", file=sys.stderr, flush=True)
        return _launch_or_train(args, job, out, nodes)
    except UserError:
        if "WORLD_SIZE" not in os.environ:  # the process the user started; never under another rank's feet
            _remove_if_untouched(out, made)
        raise
    finally:
        if holder:
            rundir.release(out)


def _launch_or_train(args, job, out, nodes=None) -> int:
    import time
    from functools import partial

    from shoal.checkpoint.choose import checkpoint_root
    from shoal.train import preempt
    from shoal.train.memory_check import CHECKED_ENV
    from shoal.train.nonfinite import EXIT_CODE, NonFiniteStep
    from shoal.train.trainer import train

    if args.launcher == "ray":
        from shoal.launch.ray import launch

        return launch(job, out, args.nproc, resume=args.resume, show=not args.quiet)
    if args.nproc > 1 or nodes or args.replica_groups:
        from shoal.launch.local import launch
        from shoal.launch.multinode import launch_nodes

        argv = ["-m", "shoal.train", *([args.recipe] if args.recipe else []),
                *[f"--set={o}" for o in args.overrides], "--resume", args.resume,
                *(["--quiet"] if args.quiet else [])]
        os.environ[CHECKED_ENV] = "1"  # the workers inherit the environment: checked once, here
        # Workers exiting 2 (a user mistake), 3 (a non-finite loss) or 75 (saved on SIGTERM) have said why.
        said_why = (2, EXIT_CODE, preempt.EXIT_CODE)
        on_sigterm = partial(preempt.exit_code_after, checkpoint_root(job.cfg, out), args.nproc * args.nnodes, out,
                             time.time())
        try:
            if args.replica_groups:
                from shoal.launch.replica_groups import launch_groups

                return launch_groups(argv, out, args.replica_groups, max(args.nproc, 1), args.max_restarts)
            argv += ["--out", str(out)]
            if nodes:
                return launch_nodes(argv, args.nproc, nodes, max_restarts=args.max_restarts, said_why=said_why,
                                    on_sigterm=on_sigterm)
            return launch(argv, args.nproc, max_restarts=args.max_restarts, said_why=said_why, on_sigterm=on_sigterm)
        finally:
            os.environ.pop(CHECKED_ENV, None)
    preempt.install()  # this process exists to train: SIGTERM saves a checkpoint, then exits
    try:
        train(job, out, show=not args.quiet, resume=args.resume)
    except NonFiniteStep as e:  # every rank stops at the same step; one of them says so
        if os.environ.get("RANK", "0") == "0":
            print(f"shoal train: error: {e}", file=sys.stderr)
        return EXIT_CODE
    except preempt.Preempted as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"shoal train: {e}", file=sys.stderr, flush=True)
        return preempt.EXIT_CODE
    return 0


def _out(args) -> str:
    """--out, or a fresh directory per run, so a run never silently replaces the previous one."""
    from shoal.errors import UserError
    from shoal.train.rundir import default_out

    if args.out is not None:
        return args.out
    if "WORLD_SIZE" in os.environ:  # each rank (and each restart) would pick its own timestamp
        raise UserError("--out", "(not given)", "under torchrun every rank must write the same directory: "
                        "pass --out DIR")
    return str(default_out(args.recipe))  # said once the checks have passed: a refusal is one line


def _missing(path: Path) -> list[Path]:
    """path and those of its folders that do not exist yet, deepest first."""
    return [p for p in (path, *path.parents) if not os.path.lexists(p)]


def _remove_if_untouched(out: Path, made: list[Path]) -> None:
    """A refused run leaves nothing behind: the lock file and the folders it made go again, unless
    something else was written into them meanwhile (rmdir takes empty folders only)."""
    from shoal.train.rundir import LOCK

    if any(p.name != LOCK for p in out.iterdir()):
        return
    for p in made:
        try:
            p.rmdir() if p.is_dir() else p.unlink(missing_ok=True)
        except OSError:
            return


def _check_ray_flags(args) -> None:
    """--launcher ray: Ray places the workers on its nodes and restarts nothing; refuse flags it would ignore."""
    from shoal.errors import UserError
    from shoal.launch.ray import require_ray

    for flag, value, unset in (("--nnodes", args.nnodes, 1), ("--node-rank", args.node_rank, 0),
                               ("--master", args.master, ""), ("--max-restarts", args.max_restarts, 0)):
        if value != unset:
            raise UserError(flag, value, "is for --launcher local; with --launcher ray leave it out (Ray places "
                                         "the workers; rerun to resume from the last checkpoint)")
    if args.nproc < 1:
        raise UserError("--nproc", args.nproc, "give the number of Ray workers with --launcher ray, e.g. --nproc 2")
    require_ray()


def _node_plan(args):
    """The multi-node plan for --nnodes > 1 (None for one machine)."""
    from shoal.errors import UserError
    from shoal.launch.multinode import multinode, plan_node

    if not multinode(args.nnodes, args.node_rank, args.master, args.ifname):
        return None
    if "WORLD_SIZE" in os.environ:
        raise UserError("--nnodes", args.nnodes, "is for starting workers; under torchrun (WORLD_SIZE is set) "
                                                 "leave out --nnodes/--master")
    if args.nproc < 1:
        raise UserError("--nproc", args.nproc, "give the workers per node with --nnodes, e.g. --nproc 8")
    if args.out is None:  # each node would pick its own timestamped directory
        raise UserError("--out", "(not given)", "with --nnodes every node must write the same directory, on a "
                                                "filesystem they share: pass --out DIR")
    return plan_node(args.nnodes, args.node_rank, args.master, args.ifname, args.rdzv_timeout, args.rdzv)


def _warn_placement(job, per_node: int) -> None:
    from shoal.parallel.mesh import placement_warning

    if line := placement_warning(job.dims, per_node):
        print(line, file=sys.stderr, flush=True)
