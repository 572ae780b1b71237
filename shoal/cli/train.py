"""`shoal train [RECIPE.toml] [--set section.key=value ...] [--out DIR] [--nproc N]`: parse, prepare, start."""

from __future__ import annotations

from shoal.cli.argtypes import non_empty, nonnegative_int
from shoal.cli.node_args import add_node_args


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
    add_node_args(p)  # --nnodes, --node-rank, --master, --ifname, --rdzv-timeout, --rdzv
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.config import load_config
    from shoal.launch.session import Options, plan_job, prepare, start, warn_ignored

    cfg = load_config(args.recipe, args.overrides)  # every user mistake in the config surfaces here
    options = Options(out=args.out, recipe=args.recipe, resume=args.resume, quiet=args.quiet, nproc=args.nproc,
                      launcher=args.launcher, max_restarts=args.max_restarts, replica_groups=args.replica_groups,
                      nnodes=args.nnodes, node_rank=args.node_rank, master=args.master or "", ifname=args.ifname or "",
                      rdzv_timeout=args.rdzv_timeout, rdzv=args.rdzv)
    if args.print_mesh:
        from shoal.cli.mesh import print_groups
        from shoal.parallel.mesh import ParallelDims

        job, _ = plan_job(cfg, options)
        warn_ignored(cfg)
        print_groups(ParallelDims.of(job.layout))
        return 0
    with prepare(cfg, options) as session:
        return start(session)
