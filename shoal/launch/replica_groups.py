"""`shoal train --replica-groups N --nproc M`: N replica groups of M workers on this machine, each
its own elastic launch, joined by a torchft lighthouse (see shoal/parallel/replicas.py).

This process holds the run directory's lock, runs the lighthouse and starts one child per group:
`python -m shoal.launch.replica_groups M MAX_RESTARTS ARGV...`, which is shoal's ordinary local
launcher (shoal/launch/local.py) for that group. When a worker dies only its own group restarts
(up to --max-restarts times); the other groups keep stepping. Group 0 writes into --out, group K
into --out/replica-K: each group's metrics.jsonl has a row for every step it took, with the number
of groups that took part in it (`replicas`).

On several machines, run the lighthouse once (`torchft_lighthouse --min_replicas 1`) and each
group's torchrun with SHOAL_REPLICA_GROUP=K, SHOAL_REPLICA_GROUPS=N and TORCHFT_LIGHTHOUSE=http://HOST:PORT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from shoal.errors import UserError
from shoal.parallel.replicas import GROUP_ENV, GROUPS_ENV, LIGHTHOUSE_ENV, group_share, import_torchft, replica_place
from shoal.rundir.lock import LAUNCHER_ENV
from shoal.worker.exit_codes import INTERRUPTED, NONFINITE, USER_ERROR

JOIN_TIMEOUT_MS = 10_000
"""How long the lighthouse waits for a live group that has not yet asked for this step's quorum
(a slower group) before going on without it."""
HEARTBEAT_TIMEOUT_MS = 1_000
"""A group silent this long is dead: quorums go on without it. Groups heartbeat every 100 ms from a
thread of their own, so a second is ten missed beats; torchft's default of 5 s would stall the
live groups that long on every failure."""


def group_config(cfg, replica_groups: int, nnodes: int):
    """The config one group trains with: its share of every global batch. replica_groups is the
    launcher's --replica-groups (0 in a group's own workers, which read their place from the environment)."""
    if replica_groups:
        check_replica_groups(replica_groups, cfg, nnodes)
        return group_share(cfg, replica_groups)
    place = replica_place()
    return group_share(cfg, place.groups, GROUPS_ENV) if place else cfg


def check_replica_groups(groups: int, cfg, nnodes: int) -> None:
    """--replica-groups mistakes, before anything starts."""
    if groups < 1:
        raise UserError("--replica-groups", groups, "must be at least 1 (0, the default, means none)")
    if nnodes > 1:
        raise UserError("--nnodes", nnodes, "with --replica-groups start each group's torchrun yourself, with "
                                            f"{GROUP_ENV}, {GROUPS_ENV} and {LIGHTHOUSE_ENV} set (see docs)")
    if cfg.parallel.diloco_overlap_steps:  # a group that rejoins fetches state, not the others' transfers in flight
        raise UserError("parallel.diloco_overlap_steps", cfg.parallel.diloco_overlap_steps,
                        "does not work with --replica-groups yet; set it to 0")
    if cfg.checkpoint.dir and Path(cfg.checkpoint.dir).is_absolute():
        raise UserError("checkpoint.dir", cfg.checkpoint.dir, "is one folder for every replica group; give a "
                                                              "relative folder so each group keeps its own")
    try:
        import_torchft()
    except ImportError as e:
        raise UserError("--replica-groups", groups, f"needs torchft ({e}); pip install 'shoal[ft]'") from None


def launch_groups(workers: list[list[str]], nproc: int, max_restarts: int) -> int:
    """Run the lighthouse and one group per `workers` entry (the argv of its workers) until every
    group is done; returns the first failing exit code."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=JOIN_TIMEOUT_MS,
                                  heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    children: list[subprocess.Popen] = []
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        for k, argv in enumerate(workers):
            env = {**os.environ, GROUP_ENV: str(k), GROUPS_ENV: str(len(workers)), LIGHTHOUSE_ENV: lighthouse.address(),
                   LAUNCHER_ENV: str(os.getpid())}  # the group's launcher dies with this process
            cmd = [sys.executable, "-m", "shoal.launch.replica_groups", str(nproc), str(max_restarts), *argv]
            children.append(subprocess.Popen(cmd, env=env))
        codes = [c.wait() for c in children]
    except KeyboardInterrupt:
        codes = [INTERRUPTED]
    finally:
        for c in children:
            if c.poll() is None:
                c.terminate()
                c.wait()
        signal.signal(signal.SIGTERM, previous)
        lighthouse.shutdown()
    return next((c for c in codes if c), 0)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _group_main(args: list[str]) -> int:
    """One group: shoal's local elastic launcher for its M workers, restarting only them."""
    from shoal.launch.local import launch
    from shoal.worker.process import die_with_parent

    die_with_parent()
    nproc, max_restarts, argv = int(args[0]), int(args[1]), args[2:]
    return launch(argv, nproc, max_restarts=max_restarts, said_why=(USER_ERROR, NONFINITE))


if __name__ == "__main__":
    sys.exit(_group_main(sys.argv[1:]))
