"""`shoal train RECIPE --launcher ray --nproc N`: the same worker under Ray Train's TorchTrainer.

Ray Train starts N worker actors, forms torch's default process group among them (gloo on CPU,
NCCL on GPUs) and sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT. Each
worker runs shoal.train.trainer.train on the Job this process resolved and checked, so every user
mistake is found here, before Ray starts anything. This process is the launcher: it holds the run
directory's lock (shoal/train/rundir.py), and turns the workers' fate into shoal's exit codes and
one line: 0, 2 (a user mistake), 3 (a non-finite loss), 1 (a worker failed or died), 130/143
(Ctrl-C / SIGTERM, which stop every worker).

Without RAY_ADDRESS a private Ray instance is started on this machine and stopped at the end; under
`ray job submit` (which sets RAY_ADDRESS) the job joins that cluster. A Ray instance the caller
started already (ray.init in the same process) is used and left running.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

from shoal.errors import UserError
from shoal.worker.exit_codes import NONFINITE, USER_ERROR

INSTALL = "pip install 'shoal[ray]'"


def require_ray() -> None:
    """Ray Train importable, or the one line that says how to get it (before anything starts)."""
    try:
        import ray.train.torch  # noqa: F401  (pulls in ray[train]'s extras, not just ray)
    except ImportError:
        raise UserError("--launcher", "ray", f"needs Ray Train, which is not installed here: {INSTALL} "
                                             "(or pip install 'ray[train]')") from None


def launch(job, out: Path, nproc: int, *, resume: str, show: bool) -> int:
    """Train `job` on `nproc` Ray workers writing into `out`; returns the job's exit code."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        _start_or_join(nproc)
    # Ray Train copies these from the driver to every worker: no second, patched copy of each print.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    trainer = _trainer(job, out, nproc, resume=resume, show=show)
    outcome: dict = {}
    # fit() in a thread: in the main thread Ray installs its own SIGINT handler, which aborts
    # "gracefully" and lets the process exit 0. Here the main thread keeps Ctrl-C and SIGTERM.
    runner = threading.Thread(target=_fit, args=(trainer, outcome), name="shoal-ray-fit", daemon=True)
    stopped, previous = _stop_on(signal.SIGINT, signal.SIGTERM)
    try:
        runner.start()
        while runner.is_alive():
            runner.join(0.2)
    except _Stopped:
        sig = signal.Signals(stopped[0])
        ray.shutdown()  # the driver leaving ends its job's actors; a private instance stops entirely
        print(f"shoal: stopped by {sig.name}; all {nproc} Ray workers were stopped", file=sys.stderr, flush=True)
        # End here: with fit()'s thread still inside Ray's core worker, the interpreter's normal exit
        # crashed with SIGSEGV (joined cluster, 1 run in 3). The kernel drops --out's lock; every
        # metrics row is already one whole write, and checkpoints commit atomically.
        sys.stdout.flush()
        os._exit(128 + int(sig))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if started_here:
        ray.shutdown()
    return exit_code(outcome.get("error"), nproc)


def _start_or_join(nproc: int) -> None:
    import ray

    quiet = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    if address := os.environ.get("RAY_ADDRESS"):  # `ray job submit`, or a user pointing at a cluster
        try:
            ray.init(**quiet)
        except ConnectionError:
            raise UserError("RAY_ADDRESS", address, "no Ray cluster answers there; start one (ray start --head) "
                                                    "or unset RAY_ADDRESS for a private local Ray") from None
        return
    # A private instance: one CPU per worker even when there are more workers than cores (as the
    # local launcher oversubscribes), else Ray would wait forever for the missing CPUs.
    ray.init(num_cpus=max(nproc, os.cpu_count() or 1), **quiet)


def _trainer(job, out: Path, nproc: int, *, resume: str, show: bool):
    import ray
    import torch
    from ray.train import FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    use_gpu = torch.cuda.is_available() or ray.cluster_resources().get("GPU", 0) > 0
    out = out.resolve()  # workers start in a folder of Ray's own
    config = dict(job=job, out=str(out), resume=resume, show=show, cwd=os.getcwd())
    return TorchTrainer(
        _worker, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=nproc, use_gpu=use_gpu),  # backend: NCCL with GPUs, else gloo
        # Ray Train's own INFO/WARNING lines (a crashed worker's shutdown traceback among them) stay in Ray's
        # log files; the launcher says what happened in one line.
        run_config=RunConfig(storage_path=str(out / "ray"), name="train", logging_config=LoggingConfig("ERROR"),
                             failure_config=FailureConfig(max_failures=0)),  # a failure ends the run: see exit_code
    )


def _worker(config: dict) -> None:
    """One Ray worker: Ray has set RANK & co and formed the process group; Ray also destroys it."""
    from shoal.train.trainer import train

    # Ray logs each rank's traceback of an exception leaving this function; for the ones that
    # carry shoal's own one-line explanation the launcher prints that line instead (exit_code).
    logging.getLogger(_RAY_TRACEBACK_LOGGER).addFilter(_drop_traceback_of_explained)
    if os.path.isdir(config["cwd"]):  # relative paths in the recipe (data.path, ...) mean the launcher's folder
        os.chdir(config["cwd"])
    train(config["job"], Path(config["out"]), show=config["show"], resume=config["resume"], keep_process_group=True)


_RAY_TRACEBACK_LOGGER = "ray.train.v2._internal.util"  # logs "Error in training function:" + traceback


def _drop_traceback_of_explained(record: logging.LogRecord) -> bool:
    from shoal.train.nonfinite import NonFiniteStep

    return not isinstance(sys.exc_info()[1], (UserError, NonFiniteStep))  # Ray logs it inside its `except`


def _fit(trainer, outcome: dict) -> None:
    try:
        trainer.fit()
    except BaseException as e:  # noqa: BLE001  (handed to the main thread, which decides)
        outcome["error"] = e


def exit_code(error: BaseException | None, nproc: int) -> int:
    """The run's exit code, with one line on stderr saying why when it is not 0."""
    if error is None:
        return 0
    from shoal.train.nonfinite import NonFiniteStep

    failures = getattr(error, "worker_failures", None) or {}
    if not failures:  # Ray itself failed (the controller, resources, the cluster going away)
        print(f"shoal: the Ray job failed: {_first_line(error)}", file=sys.stderr, flush=True)
        return 1
    rank, cause = min(failures.items())
    cause = _unwrap(cause)
    if isinstance(cause, UserError):  # the same on every rank: said once
        print(f"shoal train: error: {cause}", file=sys.stderr, flush=True)
        return USER_ERROR
    if isinstance(cause, NonFiniteStep):
        print(f"shoal train: error: {cause}", file=sys.stderr, flush=True)
        return NONFINITE
    print(f"shoal: Ray worker rank {rank} of {nproc} failed: {_first_line(cause)}", file=sys.stderr, flush=True)
    return 1


def _unwrap(error: BaseException) -> BaseException:
    """The worker's own exception inside Ray's wrappers: a RayTaskError's .cause, or what a failed
    health check found (a dead worker's ActorDiedError)."""
    while (inner := getattr(error, "cause", None) or getattr(error, "health_check_failure", None)) is not None \
            and inner is not error:
        error = inner
    return error


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


class _Stopped(Exception):
    pass


def _stop_on(*signals: signal.Signals) -> tuple[list[int], dict]:
    received: list[int] = []

    def stop(signum, frame):
        received.append(signum)
        if len(received) == 1:  # a second Ctrl-C while the workers are being stopped changes nothing
            raise _Stopped

    return received, {sig: signal.signal(sig, stop) for sig in signals}
