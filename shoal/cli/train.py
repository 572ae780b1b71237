"""`shoal train [RECIPE.toml] [--set section.key=value ...] [--out DIR]`."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("train", help="train a model (no recipe: the CPU demo)")
    p.add_argument("recipe", nargs="?", help="TOML recipe (see recipes/); default: the demo settings")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config field, e.g. --set train.steps=50 (repeatable)")
    p.add_argument("--out", default="runs/train", help="output directory (metrics.jsonl, model/)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, summary or sample")
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.config import load_config

    cfg = load_config(args.recipe, args.overrides)  # every user mistake surfaces here, before any work
    from shoal.train.trainer import train

    train(cfg, Path(args.out), show=not args.quiet)
    return 0
