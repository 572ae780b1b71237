"""`shoal run --nproc N [--check-collectives] [--hang-timeout S] script.py [args...]`.

A thin wrapper over the local elastic launcher (what `torchrun --standalone` does). The debug flags
set SHOAL_CHECK_COLLECTIVES / SHOAL_HANG_TIMEOUT_S for the workers and start the script through
shoal.debug.bootstrap, so a script gets the checker and the watchdog without editing it.
"""

from __future__ import annotations

import argparse
import os

from shoal.cli.argtypes import nonnegative_float, nonnegative_int, positive_int


def register(sub) -> None:
    p = sub.add_parser("run", help="run a torch.distributed script as N local workers (like torchrun)")
    p.add_argument("--nproc", type=positive_int, default=1, help="number of worker processes (default 1)")
    p.add_argument("--max-restarts", type=nonnegative_int, default=0, help="restart all workers this many times on failure")
    p.add_argument("--check-collectives", action="store_true",
                   help="fingerprint every collective and fail with a table when ranks disagree")
    p.add_argument("--hang-timeout", type=nonnegative_float, default=None, metavar="S",
                   help="report which ranks are stuck where after S seconds without progress (0: off)")
    p.add_argument("script", help="Python script to run on every worker")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.debug import env_settings
    from shoal.config import hang_timeout_problem
    from shoal.errors import UserError
    from shoal.launch.local import launch
    from shoal.launch.memory_check import check_local_ranks

    if not os.path.isfile(args.script):
        raise UserError("script", args.script, "no such file; give the path of a Python script to run on every worker")
    if args.hang_timeout is not None and (problem := hang_timeout_problem(args.hang_timeout)):
        raise UserError("--hang-timeout", args.hang_timeout, problem)
    env_settings(None, None)  # SHOAL_* in the environment: checked once here, not by every worker
    check_local_ranks(args.nproc)
    argv = [args.script, *args.args]
    if args.check_collectives or args.hang_timeout is not None:
        if args.check_collectives:
            os.environ["SHOAL_CHECK_COLLECTIVES"] = "1"
        if args.hang_timeout is not None:
            os.environ["SHOAL_HANG_TIMEOUT_S"] = str(args.hang_timeout)
        argv = ["-m", "shoal.debug.bootstrap", *argv]
    return launch(argv, args.nproc, max_restarts=args.max_restarts)
