"""`shoal` entry point: one subcommand per module in shoal/cli, each with `register(subparsers)`.

Every subcommand module is imported lazily by name so `shoal presets` does not pay for torch.
A UserError anywhere becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from shoal.errors import UserError

# subcommand -> module under shoal.cli that registers it
COMMANDS = {
    "train": "train",
    "generate": "generate",
    "presets": "presets",
    "config": "config_cmd",
    "plan": "plan",
    "verify": "verify",
    "mesh": "mesh",
    "doctor": "doctor",
    "run": "run",
    "ckpt": "ckpt",
    "data": "data",
    "report": "report",
    "k8s": "k8s",
    "slurm": "slurm",
}


def shown(message: str) -> str:
    """An error line with any word past 200 characters cut to its ends: `--gpus 999...9` (5,000 digits) was
    echoed whole, one line that fills a terminal."""
    return re.sub(r"\S{201,}", lambda m: f"{m[0][:60]}...{m[0][-20:]} ({len(m[0]):,} characters)", message)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other user mistake
        self.exit(2, f"{self.prog}: error: {shown(message)}\n")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="shoal", description="Plan, train, verify and debug distributed LM training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    for name, module in COMMANDS.items():
        if wanted and name != wanted:
            sub.add_parser(name)  # listed in --help, not imported
            continue
        try:
            mod = importlib.import_module(f"shoal.cli.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"shoal.cli.{module}":
                raise
            continue  # command not built yet
        mod.register(sub)
    parser.commands = sub.choices  # name -> the command's parser, for parse()
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments, or one line and exit 2. An argument no parser took argparse reports from the top
    parser ("shoal: error:"); it was given to a command, so that command's parser says it, as it says
    every other mistake ("shoal presets: error:")."""
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        _innermost(parser.commands[args.command], argv[1:]).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _innermost(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the innermost subcommand named in argv (`shoal ckpt inspect`'s, not `shoal ckpt`'s)."""
    commands = next((a.choices for a in parser._actions if isinstance(a.choices, dict)), {})  # its subparsers'
    for i, token in enumerate(argv):
        if token in commands:
            return _innermost(commands[token], argv[i + 1:])
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    try:
        from shoal.worker.env import omp_threads

        omp_threads()  # OpenMP would only warn when torch loads, and run with its default
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe fails here, inside the try, not in the interpreter's exit
        return code
    except UserError as e:
        print(f"shoal {args.command}: error: {shown(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shoal {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`shoal presets | head`): stop quietly, as Unix tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or the exit's flush raises it again
        return 1  # as rich does for the tables (Console.on_broken_pipe) and Python's docs advise


if __name__ == "__main__":
    sys.exit(main())
