"""`shoal train [RECIPE.toml] [--set section.key=value ...] [--out DIR] [--nproc N]`."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.cli.argtypes import nonnegative_int


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model (no recipe: the CPU demo)")
    p.add_argument("recipe", nargs="?", help="TOML recipe (see recipes/); default: the demo settings")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config field, e.g. --set train.steps=50 (repeatable)")
    p.add_argument("--out", default="runs/train", help="output directory (metrics.jsonl, model/)")
    p.add_argument("--nproc", type=nonnegative_int, default=0,
                   help="start this many local workers (elastic launcher); 0: run in this process")
    p.add_argument("--max-restarts", type=nonnegative_int, default=0,
                   help="when a worker dies, restart all workers from the last checkpoint, up to this many times")
    p.add_argument("--resume", default="auto", metavar="auto|never|PATH",
                   help="auto: continue from the newest intact checkpoint if there is one (default); never: start "
                        "over (refused if checkpoints exist); PATH: a checkpoint directory to start from, any layout")
    p.add_argument("--print-mesh", action="store_true", help="print the rank groups of the layout and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar, summary or sample")
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.checkpoint.choose import check_resume
    from shoal.config import load_config
    from shoal.job import resolve
    from shoal.launch.env import world_size
    from shoal.train.memory_check import CHECKED_ENV, check_memory, local_world_size

    cfg = load_config(args.recipe, args.overrides)  # every user mistake surfaces here, before any work
    world = world_size(args.nproc)  # --nproc, or the launcher's WORLD_SIZE (checked with RANK & co)
    job = resolve(cfg, world)
    check_resume(cfg, Path(args.out), args.resume)
    if args.print_mesh:
        from shoal.cli.mesh import print_groups

        print_groups(job.dims)
        return 0
    if cfg.train.memory_check and not os.environ.get(CHECKED_ENV):  # the launcher's workers skip it
        check_memory(job, local_world_size(args.nproc))
    from shoal.train.trainer import build_data, train

    if args.nproc > 1:
        from shoal.launch.local import launch

        build_data(job)  # data mistakes too: once, before any worker starts
        argv = ["-m", "shoal.train", *([args.recipe] if args.recipe else []),
                *[f"--set={o}" for o in args.overrides], "--out", args.out, "--resume", args.resume,
                *(["--quiet"] if args.quiet else [])]
        os.environ[CHECKED_ENV] = "1"  # the workers inherit the environment: checked once, here
        try:
            return launch(argv, args.nproc, max_restarts=args.max_restarts)
        finally:
            os.environ.pop(CHECKED_ENV, None)
    train(job, Path(args.out), show=not args.quiet, resume=args.resume)
    return 0

