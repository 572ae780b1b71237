"""Worker entry point: `torchrun ... -m shoal.train [RECIPE] [--set ...] [--out DIR]`.

`shoal train --nproc N` starts N of these through the elastic launcher; on a cluster torchrun (or
Slurm/Kubernetes calling it) does the same with the same arguments.

A worker dies with the process that started it: the kernel sends it SIGKILL when its parent exits
(prctl PR_SET_PDEATHSIG), so killing the launcher, even with SIGKILL, leaves no orphan training
on; stopping the launcher (Ctrl-C, SIGTERM) ends its workers with SIGKILL (shoal/launch/local.py).
Checkpoints commit atomically, so nothing that a save had finished is lost.
A user mistake is the same on every rank: each node's first rank says it in one line, every rank exits 2.
A rank whose peer died says so in one line, not a traceback from inside the collective.
"""

import ctypes
import os
import signal
import sys

from shoal.cli.main import build_parser
from shoal.errors import UserError
from shoal.launch.worker_exit import LOST_PEER_EXIT_CODE, exit_worker, lost_peer
from shoal.train.rundir import LAUNCHER_ENV

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not fatal: the launcher still stops its workers on SIGINT/SIGTERM
    if os.getppid() != parent or _gone(os.environ.get(LAUNCHER_ENV)):
        os._exit(1)  # the launcher died before the request took effect: this worker is already an orphan


def _gone(pid: str | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False


def main() -> int:
    if "WORLD_SIZE" in os.environ:  # started by a launcher
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # never a KeyboardInterrupt traceback per rank
    argv = ["train", *sys.argv[1:]]
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        if os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) == "0":  # one line on each node's console
            print(f"shoal train: error: {e}", file=sys.stderr, flush=True)
        return 2
    except RuntimeError as e:
        why = lost_peer(e) if "WORLD_SIZE" in os.environ else None
        if why is None:
            raise
        print(f"shoal train: rank {os.environ['RANK']} stopped: a peer is gone ({why}); the launcher's line names "
              f"the worker that failed first", file=sys.stderr, flush=True)
        return LOST_PEER_EXIT_CODE


if __name__ == "__main__":
    exit_worker(main())
