"""`shoal config [RECIPE] [--set ...]`: every config field with its value and meaning."""

from __future__ import annotations

from shoal.cli.argtypes import non_empty


def register(sub) -> None:
    p = sub.add_parser("config", help="print the config reference (with a recipe: its resolved values)")
    p.add_argument("recipe", nargs="?", type=non_empty("recipes/debug.toml"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--markdown", action="store_true", help="print the reference as a Markdown table")
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.config import config_reference, load_config

    cfg = load_config(args.recipe, args.overrides)
    rows = config_reference(cfg)
    if args.markdown:
        print("| field | value | meaning |\n|---|---|---|")
        for name, value, doc in rows:
            print(f"| `{name}` | `{value}` | {doc} |")
        return 0
    from rich.table import Table

    from shoal.cli.console import console

    table = Table(title="shoal config")
    for col in ("field", "value", "meaning"):
        table.add_column(col)
    for name, value, doc in rows:
        table.add_row(name, repr(value), doc)
    console().print(table)
    return 0
