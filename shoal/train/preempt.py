"""SIGTERM (preemption, `scancel`, a time limit) stops the run after a step, with a checkpoint of it.

Schedulers announce the end of a job with SIGTERM and send SIGKILL some seconds later (Slurm's
KillWait, 30 s by default; Kubernetes' terminationGracePeriodSeconds; the elastic agent's shutdown
timeout, 30 s). The handler only sets a flag. After every step the trainer asks `agreed()`: one
all-reduce MAX of that flag over the world, so every rank stops after the same step although the
signal reaches the ranks at different moments (or only some of them). Every rank then writes a
checkpoint of that step synchronously (after any async save in flight), rank 0 says so in one
line, and the process exits with exit_codes.PREEMPTED (75). The `shoal slurm` script requeues the job on that
code, and the requeued job resumes from the checkpoint (--resume auto).

The last step is never stopped: the run finishes and exits 0, since nothing would be left to resume
(the launcher too, when a SIGTERM came during the last step or the final model's export).
"""

from __future__ import annotations

import signal
import threading
import time

from shoal.worker.exit_codes import PREEMPTED, TERMINATED



class Preempted(Exception):
    """Every rank stopped after a step on SIGTERM; the checkpoint of that step is committed."""

    def __init__(self, step: int, path: str):
        self.step, self.path = step, path
        super().__init__(f"stopped by SIGTERM after step {step}; checkpoint {path} is committed; exiting with "
                         f"code {PREEMPTED} (the same command resumes from it)")


_received_at: list[float] = []  # when SIGTERM arrived in this process (empty: not yet)


def _on_sigterm(signum, frame) -> None:
    # Only a flag: the main thread may be anywhere (inside a save, between two collectives).
    _received_at.append(time.time())


_on_sigterm.shoal_stops_after_a_step = True  # the hang watchdog chains to it instead of exiting (debug/watchdog.py)


def install() -> None:
    """In a process that exists to train (a worker, or `shoal train` without --nproc): SIGTERM stops
    the run after the current step. Only the main thread can set handlers; elsewhere nothing changes."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def agreed(rt) -> bool:
    """True on every rank when SIGTERM reached any rank. Collective: every rank calls it after every step."""
    if rt.world_size == 1:
        return bool(_received_at)
    import torch
    import torch.distributed as dist

    flag = torch.tensor([len(_received_at)], dtype=torch.int32, device=rt.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def stopped(rt, step: int, path) -> Preempted:
    """After the stop's checkpoint: wait until every rank is here (rank 0 has committed it), since a
    scheduler may kill the whole job as soon as one process exits (srun --kill-on-bad-exit)."""
    if rt.world_size > 1:
        import torch.distributed as dist

        dist.barrier()
    return Preempted(step, str(path))


def exit_code_after(root, workers: int, out, started: float, since: float) -> int:
    """The launcher's exit code once its workers are gone after a SIGTERM that came at `since`:
    0 when the run finished anyway (the signal came during its last step or its final export, and
    this launch, begun at `started`, wrote <out>/model), PREEMPTED when a checkpoint was committed
    after the signal (rank 0 has said so), else 128 + SIGTERM."""
    import sys

    from shoal.checkpoint import store
    from shoal.checkpoint.choose import final_model_written

    if final_model_written(out, since=started):
        return 0
    newest = store.newest_valid(root, checksums=False)
    if newest is not None and store.read_train_state(newest).get("time", 0) >= since:
        return PREEMPTED
    print(f"shoal: stopped by SIGTERM before a checkpoint could be written; all {workers} workers were stopped",
          file=sys.stderr, flush=True)
    return TERMINATED
