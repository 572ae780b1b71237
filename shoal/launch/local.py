"""Start N local worker processes through PyTorch's elastic agent (the machinery behind torchrun).

`shoal train --nproc N` and `shoal run --nproc N script.py` both come here. On a cluster the same
workers are started by `torchrun` (or Slurm/Kubernetes calling it); nothing here is needed there.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import uuid

from shoal.errors import UserError


def worker_env(nproc: int) -> dict[str, str]:
    """One compute thread per CPU worker unless the user chose otherwise: N workers share N cores."""
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    return env


def launch(argv: list[str], nproc: int, *, max_restarts: int = 0, run_id: str | None = None,
           nodes: dict | None = None) -> int:
    """Run `python ARGV...` as `nproc` workers on this machine; returns the job's exit code.

    Rendezvous is a c10d store on localhost on a free port (like `torchrun --standalone`).
    When a worker fails the agent stops the others and, up to max_restarts times, starts all
    workers again (`shoal train` then resumes from its last checkpoint).

    Restarts need a fresh store for the workers' process groups. By default (torch >= 2.4) the
    agent hosts one TCPStore for the whole job and every attempt's workers connect to it: the
    keys the dead attempt's process groups wrote (gloo's `default_pg/0//cpu//0/<rank>` = each
    rank's listening address; NCCL's unique id) are still there, so a restarted rank can read a
    dead peer's address and fail with "Connection refused" (pytorch#135712).
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 makes each rendezvous round publish a new MASTER_PORT
    on which worker rank 0 hosts a new, empty store.

    `nodes` replaces LaunchConfig fields for a multi-node job (shoal.launch.multinode says which and why).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc < 1:
        raise UserError("--nproc", nproc, "must be a positive integer")
    os.environ.update(worker_env(nproc))  # the agent passes its environment to the workers
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # a fresh store per attempt (see above)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=run_id or f"shoal-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", rdzv_configs={"timeout": 120},
        max_restarts=max_restarts, monitor_interval=0.1, start_method="spawn",
    )
    # The agent logs every life-cycle event at INFO; keep only warnings and errors.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    if nodes:
        config = dataclasses.replace(config, **nodes)
    report = _FailureReport(nproc, max_restarts)
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    agent_log.addFilter(report)
    try:
        elastic_launch(config, entrypoint=sys.executable)(*argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(f"shoal: worker rank {rank} failed (exit code {failure.exitcode}); "
              f"see its output above", file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 1
    finally:
        agent_log.removeFilter(report)
    return 0


class _FailureReport(logging.Filter):
    """Turns the agent's "failed (exitcode: -9) local_rank: 1 (pid: 123)" into one line saying what
    happened and what comes next."""

    def __init__(self, nproc: int, max_restarts: int):
        super().__init__()
        self.nproc, self.max_restarts, self.failures = nproc, max_restarts, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.max_restarts or not str(record.msg).startswith("failed (exitcode:") or len(record.args or ()) < 3:
            return True  # without restarts, the launcher's own "worker rank N failed" line says it all
        code, rank, pid = record.args[:3]
        self.failures += 1
        how = f"exited with code {code}"
        if isinstance(code, int) and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        if self.failures <= self.max_restarts:
            then = (f"restarting all {self.nproc} workers "
                    f"(restart {self.failures} of {self.max_restarts})")
        else:
            then = "no restarts left"
        print(f"shoal: worker rank {rank} (pid {pid}) {how}; {then}", file=sys.stderr, flush=True)
        return False
