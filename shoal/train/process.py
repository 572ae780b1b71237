"""Train in this process, and turn how the run ended into its exit code.

What `shoal train` without --nproc runs, and each worker a launcher starts (shoal/train/__main__.py).
A SIGTERM stops the run after a step, with a checkpoint of it (preempt.py); a non-finite loss stops
every rank at the same step (nonfinite.py). Either is said in one line, by rank 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from shoal.job import Job
from shoal.train import preempt
from shoal.train.nonfinite import NonFiniteStep
from shoal.worker.exit_codes import DONE, NONFINITE, PREEMPTED
from shoal.worker.streams import forgive_closed_output


def train_here(job: Job, out: Path, *, resume: str = "auto", show: bool = True) -> int:
    from shoal.train.trainer import train

    forgive_closed_output()  # `shoal train | head`: progress lines never stop a run
    preempt.install()  # this process exists to train: SIGTERM saves a checkpoint, then exits
    main = os.environ.get("RANK", "0") == "0"
    try:
        train(job, Path(out), show=show, resume=resume)
    except NonFiniteStep as e:  # every rank stops at the same step; one of them says so
        if main:
            print(f"shoal train: error: {e}", file=sys.stderr)
        return NONFINITE
    except preempt.Preempted as e:
        if main:
            print(f"shoal train: {e}", file=sys.stderr, flush=True)
        return PREEMPTED
    return DONE
