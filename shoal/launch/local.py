"""Start N local worker processes through PyTorch's elastic agent (the machinery behind torchrun).

`shoal train --nproc N` and `shoal run --nproc N script.py` both come here. On a cluster the same
workers are started by `torchrun` (or Slurm/Kubernetes calling it); nothing here is needed there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from shoal.errors import UserError
from shoal.rundir.lock import LAUNCHER_ENV
from shoal.worker.exit_codes import HANG, LOST_PEER, USER_ERROR
from shoal.worker.process import children
from shoal.worker.said import SAID_DIR_ENV, left_line, make_said_dir


def worker_env(nproc: int) -> dict[str, str]:
    """What the workers run with, unless the user chose otherwise:
    - one compute thread per CPU worker: N workers share N cores;
    - torch's C++ log at ERROR: when a peer dies, c10d's store client logs each reconnect attempt as a
      WARNING with a 60-frame C++ stack before shoal's one line says which rank died and how
      (TORCH_CPP_LOG_LEVEL=WARNING brings them back)."""
    env = {}
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = "1"
    if "TORCH_CPP_LOG_LEVEL" not in os.environ:
        env["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    return env


def prestart(argv: list[str], nproc: int) -> None:
    """Start now the forkserver a launch(ARGV, nproc) to come forks its workers from, so its imports run
    beside what this process does until then (forkserver_start.py says why); a no-op for workers that
    are not forked. Without it launch() starts it itself."""
    from shoal.launch.forkserver_start import forkable, start

    if module := forkable(argv):
        with contextlib.suppress(OSError):  # then launch() tries again, and else starts fresh interpreters
            start(module, {**worker_env(nproc), LAUNCHER_ENV: str(os.getpid())})  # as launch() sets them


def launch(argv: list[str], nproc: int, *, max_restarts: int = 0, run_id: str | None = None,
           said_why: tuple[int, ...] = (), nodes: dict | None = None,
           on_sigterm: Callable[[float], int] | None = None) -> int:
    """Run `python ARGV...` as `nproc` workers on this machine; returns the job's exit code.

    Rendezvous is a c10d store on localhost on a free port (like `torchrun --standalone`).
    When a worker fails the agent stops the others and, up to max_restarts times, starts all
    workers again (`shoal train` then resumes from its last checkpoint). said_why: worker exit
    codes that follow the worker's own one-line explanation; the launcher adds nothing to those.

    Restarts need a fresh store for the workers' process groups. By default (torch >= 2.4) the
    agent hosts one TCPStore for the whole job and every attempt's workers connect to it: the
    keys the dead attempt's process groups wrote (gloo's `default_pg/0//cpu//0/<rank>` = each
    rank's listening address; NCCL's unique id) are still there, so a restarted rank can read a
    dead peer's address and fail with "Connection refused" (pytorch#135712).
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 makes each rendezvous round publish a new MASTER_PORT
    on which worker rank 0 hosts a new, empty store.

    `nodes` replaces LaunchConfig fields for a multi-node job (shoal.launch.multinode says which and why).

    on_sigterm: SIGTERM to this process is passed on to the workers, which stop after their step
    and save (shoal/train/preempt.py); the agent waits for them up to its shutdown timeout
    (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, 30 s) and then on_sigterm(the time the signal came) gives the
    exit code. Without it SIGTERM stops the workers outright, like Ctrl-C.
    """
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from shoal.launch.forked import forked_workers

    if nproc < 1:
        raise UserError("--nproc", nproc, "must be a positive integer")
    _name_rendezvous_events_cheaply()
    os.environ.update(worker_env(nproc))  # the agent passes its environment to the workers
    os.environ[LAUNCHER_ENV] = str(os.getpid())  # workers die with this process, and use its --out lock
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")  # a fresh store per attempt (see above)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=run_id or f"shoal-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", rdzv_configs={"timeout": 120},
        max_restarts=max_restarts, monitor_interval=0.1, start_method="spawn",
        signals_to_handle="SIGHUP,SIGQUIT",  # SIGINT and SIGTERM: _stop_workers_outright_on below
    )
    # The agent logs every life-cycle event at INFO; keep only warnings and errors.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    if nodes:
        config = dataclasses.replace(config, **nodes)
    report = _FailureReport(nproc, max_restarts)
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    agent_log.addFilter(report)
    quiet_signals = _DropSignalChatter()
    chatty = [agent_log, logging.getLogger("torch.distributed.elastic.agent.server.api")]
    for log in chatty:
        log.addFilter(quiet_signals)
    stopped_by, previous = _stop_workers_outright_on(signal.SIGINT, *([] if on_sigterm else [signal.SIGTERM]))
    if on_sigterm:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _pass_on(stopped_by))
    said = make_said_dir()  # where a worker that does not print leaves its refusal
    os.environ[SAID_DIR_ENV] = said
    try:
        with report.watching(), forked_workers(argv):
            elastic_launch(config, entrypoint=sys.executable)(*argv)
    except SignalException as e:  # raised by the signal handlers, caught by the agent after it stopped the workers
        sig = signal.Signals(stopped_by[0][0] if stopped_by else e.sigval)
        if sig == signal.SIGTERM and on_sigterm:
            return on_sigterm(stopped_by[0][1])
        print(f"shoal: stopped by {sig.name}; all {nproc} workers were stopped", file=sys.stderr)
        return 128 + int(sig)
    except ChildFailedError as e:
        return _failed(e, report, said_why, said)
    finally:
        shutil.rmtree(said, ignore_errors=True)
        os.environ.pop(SAID_DIR_ENV, None)
        agent_log.removeFilter(report)
        for log in chatty:
            log.removeFilter(quiet_signals)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _name_rendezvous_events_cheaply() -> None:
    """torch's c10d rendezvous names the method behind each event it records with inspect.stack(),
    which builds every frame's source context and scans sys.modules for each frame (cpython#92041):
    0.15-0.3 s a call in this process, nine calls a launch and more for each restart, all before a
    worker starts. It keeps only the function's name, which the frame itself holds."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name  # the frame inspect.stack()[depth] describes
        except ValueError:  # a stack shallower than depth
            return "no_method_name"

    if hasattr(dynamic_rendezvous, "get_method_name"):
        dynamic_rendezvous.get_method_name = method_name


def _failed(e, report: "_FailureReport", said_why: tuple[int, ...], said: str = "") -> int:
    """The job's exit code when a worker failed, with one line naming the worker the others followed
    and how it ended (nothing when the worker said why itself). A refusal only a worker that does not
    print found is printed here, from the line it left (shoal/worker/said.py)."""
    rank, failure = root_failure(e)
    if failure.exitcode in said_why:
        first_refused = any(f.local_rank == 0 and f.exitcode == USER_ERROR for f in e.failures.values())
        if failure.exitcode == USER_ERROR and failure.local_rank != 0 and not first_refused:
            if said and (line := left_line(said, rank)):
                print(line, file=sys.stderr)
        return failure.exitcode
    if failure.pid in report.force_killed:  # the launcher's own SIGKILL: not from outside
        print(f"shoal: worker rank {rank} {report.frozen(failure, e.failures)}", file=sys.stderr)
        return HANG  # a frozen worker is a hang: the launcher gave up waiting on it, as timeout(1) does
    elif -failure.exitcode in (signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # it had nothing to say
        print(f"shoal: worker rank {rank} {how_it_ended(failure.exitcode)} (exit code {failure.exitcode}), from "
              f"outside shoal (the kernel's OOM killer, a scheduler, kill); the other workers stopped when they "
              f"lost it", file=sys.stderr)
    elif failure.exitcode < 0:  # SIGABRT, SIGSEGV, ...: a crash inside the process
        print(f"shoal: worker rank {rank} crashed ({how_it_ended(failure.exitcode)}, exit code "
              f"{failure.exitcode}); see its output above", file=sys.stderr)
    else:
        print(f"shoal: worker rank {rank} failed (exit code {failure.exitcode}); "
              f"see its output above", file=sys.stderr)
    return failure.exitcode if failure.exitcode > 0 else 1


def _stop_workers_outright_on(*signals: signal.Signals) -> tuple[list[int], dict]:
    """Ctrl-C (and SIGTERM, for workers that do not save on it) ends the workers with SIGKILL, at once and in silence.

    The agent's own handlers forward the signal itself; a worker then either sits out a collective
    its dead peer never joins, or its hang watchdog (shoal/debug/watchdog.py) takes the peer's
    exit for a failure and writes an incident report. Nothing in a worker needs a clean exit:
    checkpoints commit atomically and metrics rows are whole lines. The agent keeps SIGHUP and
    SIGQUIT; we take these, kill the workers (this process's children) and hand the agent a
    SignalException asking for SIGKILL, which it sends to any it started since. Returns the list
    the received signal (and when it came) goes into, and the handlers to put back.
    """
    from torch.distributed.elastic.multiprocessing import SignalException

    received: list[tuple[int, float]] = []

    def stop(signum, frame):
        received.append((signum, time.time()))
        workers = _workers()
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # all frozen first: none sees a peer die and complains
            for pid in workers:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        raise SignalException(f"shoal launcher got {signal.Signals(signum).name}", sigval=signal.SIGKILL)

    return received, {sig: signal.signal(sig, stop) for sig in signals}


def _pass_on(received: list[tuple[int, float]]):
    """A SIGTERM handler that has the agent pass the signal on to the workers and wait for them to
    exit (its SignalException path); a second SIGTERM changes nothing, the agent's timeout bounds the wait."""
    from torch.distributed.elastic.multiprocessing import SignalException

    def pass_on(signum, frame):
        if received:
            return
        received.append((signum, time.time()))
        raise SignalException("shoal launcher got SIGTERM", sigval=signal.SIGTERM)

    return pass_on


def _stopped(pid: int) -> bool:
    """The process is stopped by a signal (T) or a tracer (t), from /proc/PID/stat."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _workers() -> list[int]:
    """This launcher's workers: its children, and the forkserver's (shoal/launch/forked.py)."""
    from shoal.launch.forked import helper_pids

    helpers = helper_pids()
    return [p for p in children(os.getpid()) if p not in helpers] + [p for h in helpers for p in children(h)]


class _DropSignalChatter(logging.Filter):
    """The agent logs each step of a signal shutdown (received, closing pid ..., sending ...); the
    launcher's one line says it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not ("death signal" in msg or msg.startswith(("Closing process", "Sending process")))


FOLLOWERS = (HANG, LOST_PEER)
"""Exit codes of a rank giving up on a peer that went first: after a hang report, or on a lost
connection (shoal/worker/exit.py)."""


def root_failure(e) -> tuple[int, object]:
    """(rank, failure) of the worker the others followed, from the agent's ChildFailedError."""
    return _root(e.failures) if e.failures else e.get_first_failure()


def _root(failures: dict) -> tuple[int, object]:
    """The earliest failure that is not a follower. The agent's own choice, the earliest timestamp,
    cannot tell them apart: a killed worker leaves no error file, its timestamp is the second the
    agent noticed, and a peer that lost it within the same 0.1 s poll ties with it and can win."""
    causes = {r: f for r, f in failures.items() if f.exitcode not in FOLLOWERS} or failures
    # In a tie, a worker ended by SIGTERM comes last: that is the signal the agent stops the others with (killed by
    # it, or exiting 128 + SIGTERM from its handler, as the hang watchdog's does once it has said its part).
    rank = min(causes, key=lambda r: (causes[r].timestamp, causes[r].exitcode in (-signal.SIGTERM, 128 + signal.SIGTERM), r))
    return rank, causes[rank]


def how_it_ended(code) -> str:
    """'exited with code 3' or, for the agent's negative codes, 'was killed by SIGKILL'."""
    if isinstance(code, int) and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class _FailureReport(logging.Filter):
    """With restarts, one line per failed attempt saying which worker failed, how, and what comes
    next, in place of the agent's "failed (exitcode: -9) local_rank: 1 (pid: 123)". That line names
    the agent's choice of worker (see _root), so the line is written from the attempt's whole list
    of failures, which `watching` hands over as the agent collects it."""

    def __init__(self, nproc: int, max_restarts: int):
        super().__init__()
        self.nproc, self.max_restarts, self.failures = nproc, max_restarts, 0
        self.force_killed: set[int] = set()  # pids the agent SIGKILLed after they ignored its SIGTERM

    def filter(self, record: logging.LogRecord) -> bool:
        # With restarts attempt_failed says it; without, launch()'s own "worker rank N ..." line follows
        # (naming the root worker, which this line may not), or the worker's own line said why.
        if str(record.msg).startswith("Unable to shutdown process") and record.args:
            self.force_killed.add(int(record.args[0]))  # said by frozen() instead, as the cause it is
            return False
        return not str(record.msg).startswith("failed (exitcode:")

    @staticmethod
    def frozen(failure, failures: dict) -> str:
        """A worker that the agent had to SIGKILL: it kept still through the SIGTERM that stops a
        failed attempt's workers, so it was frozen (SIGSTOP, a debugger) or stuck in the kernel."""
        said = (" (the hang report above says where it stopped)"
                if any(f.exitcode == HANG for f in failures.values()) else "")
        return (f"(pid {failure.pid}) stopped responding (frozen by SIGSTOP or a debugger, or stuck in the kernel "
                f"through the launcher's SIGTERM), so the launcher killed it{said}")

    def attempt_failed(self, failures: dict) -> None:
        if not self.max_restarts:
            return
        rank, failure = _root(failures)
        self.failures += 1
        if self.failures <= self.max_restarts:
            then = f"restarting all {self.nproc} workers (restart {self.failures} of {self.max_restarts})"
        else:
            then = "no restarts left"
        how = (self.frozen(failure, failures) if failure.pid in self.force_killed
               else f"(pid {failure.pid}) {how_it_ended(failure.exitcode)}")
        print(f"shoal: worker rank {rank} {how}; {then}", file=sys.stderr, flush=True)

    def kill_frozen(self, pids) -> None:
        """SIGKILL the workers that are stopped (SIGSTOP, a debugger): the SIGTERM the agent is about
        to send would wait its whole shutdown timeout (30 s) on each, and they can save nothing."""
        for pid in pids:
            if _stopped(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    self.force_killed.add(pid)

    @contextlib.contextmanager
    def watching(self):
        """Hands each failed attempt's failures to attempt_failed, and frozen workers to kill_frozen
        before the agent stops an attempt: the agent polls its workers through
        SubprocessContext._poll, keeps the result to itself, and stops them with close()."""
        from torch.distributed.elastic.multiprocessing.api import SubprocessContext

        poll, close = getattr(SubprocessContext, "_poll", None), SubprocessContext.close
        if poll is None:  # a torch without this private method: only the end-of-job line is printed
            yield
            return

        def _poll(context):
            result = poll(context)
            if result is not None and result.is_failed():
                self.attempt_failed(result.failures)
            return result

        def _close(context, *args, **kwargs):
            with contextlib.suppress(Exception):  # pids() of a context that never started
                self.kill_frozen(context.pids().values())
            return close(context, *args, **kwargs)

        SubprocessContext._poll, SubprocessContext.close = _poll, _close
        try:
            yield
        finally:
            SubprocessContext._poll, SubprocessContext.close = poll, close
