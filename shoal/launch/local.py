"""Start N local worker processes through PyTorch's elastic agent (the machinery behind torchrun).

`shoal train --nproc N` and `shoal run --nproc N script.py` both come here. On a cluster the same
workers are started by `torchrun` (or Slurm/Kubernetes calling it); nothing here is needed there.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid

from shoal.errors import UserError


def worker_env(nproc: int) -> dict[str, str]:
    """One compute thread per CPU worker unless the user chose otherwise: N workers share N cores."""
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    return env


def launch(argv: list[str], nproc: int, *, max_restarts: int = 0, run_id: str | None = None) -> int:
    """Run `python ARGV...` as `nproc` workers on this machine; returns the job's exit code.

    Rendezvous is a c10d store on localhost on a free port (like `torchrun --standalone`).
    When a worker fails the agent stops the others and, up to max_restarts times, starts all
    workers again.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc < 1:
        raise UserError("--nproc", nproc, "must be a positive integer")
    os.environ.update(worker_env(nproc))  # the agent passes its environment to the workers
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=run_id or f"shoal-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", rdzv_configs={"timeout": 120},
        max_restarts=max_restarts, monitor_interval=0.1, start_method="spawn",
    )
    # The agent logs every life-cycle event at INFO; keep only warnings and errors.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    try:
        elastic_launch(config, entrypoint=sys.executable)(*argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(f"shoal: worker rank {rank} failed (exit code {failure.exitcode}); "
              f"see its output above", file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 1
    return 0
