"""`shoal train [RECIPE.toml] [--set section.key=value ...] [--out DIR] [--nproc N]`."""

from __future__ import annotations

import os
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model (no recipe: the CPU demo)")
    p.add_argument("recipe", nargs="?", help="TOML recipe (see recipes/); default: the demo settings")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config field, e.g. --set train.steps=50 (repeatable)")
    p.add_argument("--out", default="runs/train", help="output directory (metrics.jsonl, model/)")
    p.add_argument("--nproc", type=int, default=0, help="start this many local workers (elastic launcher)")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="when a worker dies, restart all workers from the last checkpoint, up to this many times")
    p.add_argument("--resume", default="auto", metavar="auto|never|PATH",
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
    from shoal.job import env_world_size, resolve
    from shoal.train.memory_check import CHECKED_ENV, check_memory, local_world_size

    cfg = load_config(args.recipe, args.overrides)  # every user mistake surfaces here, before any work
    if "WORLD_SIZE" not in os.environ:  # srun -n2 shoal train: two copies that would each train alone
        from shoal.launch.slurm import check_srun_copies

        check_srun_copies(args.nnodes)
    job = resolve(cfg, (args.nproc or env_world_size()) * args.nnodes)  # nnodes > 1: --nproc is per node
    nodes = _node_plan(args)  # a multi-node job's network, checked before any worker starts
    check_resume(cfg, Path(args.out), args.resume)
    if args.print_mesh:
        from shoal.cli.mesh import print_groups

        print_groups(job.dims)
        return 0
    if cfg.train.memory_check and not os.environ.get(CHECKED_ENV):  # the launcher's workers skip it
        check_memory(job, local_world_size(args.nproc))
    if not os.environ.get(CHECKED_ENV) and os.environ.get("RANK", "0") == "0":  # said once: launcher or rank 0
        _warn_placement(job, local_world_size(args.nproc))
    if (args.nproc > 1 or nodes) and "WORLD_SIZE" not in os.environ:
        from shoal.data.sources import list_documents
        from shoal.data.tokenizer import load_tokenizer
        from shoal.launch.local import launch
        from shoal.launch.multinode import launch_nodes

        load_tokenizer(cfg.data.tokenizer)  # data mistakes too are reported once, before N workers start
        list_documents(cfg.data.path, cfg.data.text_field)

        argv = ["-m", "shoal.train", *([args.recipe] if args.recipe else []),
                *[f"--set={o}" for o in args.overrides], "--out", args.out, "--resume", args.resume,
                *(["--quiet"] if args.quiet else [])]
        os.environ[CHECKED_ENV] = "1"  # the workers inherit the environment: checked once, here
        try:
            if nodes:
                return launch_nodes(argv, args.nproc, nodes, max_restarts=args.max_restarts)
            return launch(argv, args.nproc, max_restarts=args.max_restarts)
        finally:
            os.environ.pop(CHECKED_ENV, None)
    from shoal.train.trainer import train

    train(job, Path(args.out), show=not args.quiet, resume=args.resume)
    return 0


def _node_plan(args):
    """The multi-node plan for --nnodes > 1 (None for one machine)."""
    from shoal.errors import UserError
    from shoal.launch.multinode import plan_node

    if args.nnodes == 1 and not args.master:
        return None
    if "WORLD_SIZE" in os.environ:
        raise UserError("--nnodes", args.nnodes, "is for starting workers; under torchrun (WORLD_SIZE is set) "
                                                 "leave out --nnodes/--master")
    if args.nproc < 1:
        raise UserError("--nproc", args.nproc, "give the workers per node with --nnodes, e.g. --nproc 8")
    return plan_node(args.nnodes, args.node_rank, args.master, args.ifname, args.rdzv_timeout)


def _warn_placement(job, per_node: int) -> None:
    import sys

    from shoal.parallel.mesh import placement_warning

    if line := placement_warning(job.dims, per_node):
        print(line, file=sys.stderr, flush=True)
