"""A worker: `python -m shoal.train --job OUT/job.json`, or under plain torchrun (and Slurm or
Kubernetes calling it) `torchrun ... -m shoal.train [RECIPE] [--set S.K=V ...] --out DIR`.

shoal's launchers (`shoal train --nproc N`, --nnodes, --replica-groups) prepare the job once and
start their workers with --job: a worker reads the job and trains, checking nothing again. Under
plain torchrun no process prepared it, so each rank does (shoal/launch/session.py): each resolves
the recipe, rank 0 checks the output folder and the checkpoints and holds the lock.

A user mistake is the same on every rank: each node's first rank says it in one line, every rank
exits 2. A rank whose peer died says so in one line, not a traceback from inside the collective.
"""

import argparse
import os
import sys

from shoal.errors import UserError
from shoal.worker.exit import exit_worker, lost_peer
from shoal.worker.exit_codes import LOST_PEER, USER_ERROR
from shoal.worker.process import follow_the_launcher
from shoal.worker.said import a_peer_refused, leave_line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other user mistake
        self.exit(USER_ERROR, f"shoal train: error: {message} (under torchrun: -m shoal.train [RECIPE] "
                              "[--set SECTION.KEY=VALUE ...] --out DIR [--resume auto|never|PATH] [--quiet])\n")


def parse(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="python -m shoal.train")
    p.add_argument("recipe", nargs="?")
    p.add_argument("--job", help="the job.json a shoal launcher prepared")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--out")
    p.add_argument("--resume", default="auto")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    for flag, value in (("recipe", args.recipe), ("--out", args.out), ("--resume", args.resume)):
        if value is not None and not value.strip():
            p.error(f"{flag} must not be empty, got {value!r}")
    return args


def run(args: argparse.Namespace) -> int:
    from shoal.train.process import train_here

    if args.job:
        from shoal.job import load_job

        job, how = load_job(args.job)
        return train_here(job, how["out"], resume=how["resume"], show=how["show"])
    from shoal.config import load_config
    from shoal.launch.session import Options, prepare  # the one import up a floor (test_architecture.py: why)

    options = Options(out=args.out, recipe=args.recipe, resume=args.resume, quiet=args.quiet)
    with prepare(load_config(args.recipe, args.overrides), options) as session:
        return train_here(session.job, session.out, resume=args.resume, show=not args.quiet)


def main() -> int:
    follow_the_launcher()
    args = parse(sys.argv[1:])
    try:
        return run(args)
    except UserError as e:
        line = f"shoal train: error: {e}"
        if os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) == "0":  # one line on each node's console
            print(line, file=sys.stderr, flush=True)
        # for the launcher to print if this rank alone found it, and for the peers it leaves (shoal/worker/said.py)
        leave_line(line)
        return USER_ERROR
    except RuntimeError as e:
        why = lost_peer(e) if "WORLD_SIZE" in os.environ else None
        if why is None:
            raise
        if a_peer_refused():  # the peer said why in its own line
            return LOST_PEER
        print(f"shoal train: rank {os.environ['RANK']} stopped: a peer is gone ({why}); the launcher's line names "
              f"the worker that failed first", file=sys.stderr, flush=True)
        return LOST_PEER


if __name__ == "__main__":
    exit_worker(main())
