"""Workers forked from a process that has already imported torch and the training loop.

A worker started as `python -m shoal.train` spends ~5 s of CPU importing torch, DTensor, DCP and
pipelining before it reads its job (`python -X importtime -c "import shoal.train.trainer"`); four
workers on one machine pay that four times, and again after every restart (bench/bench_launch.py:
a 3-step 4-rank run took 28.7 s of CPU and 16.8 s on 2 cores, forked 13.5 s and 11.0 s). So the launcher starts
multiprocessing's forkserver, which imports them once (started ahead of the launch where the launcher
knows it will launch: forkserver_start.py), and each of shoal's own workers is forked from it and runs
its module as `python -m` would. Only the birth changes: the elastic agent still
starts and watches each worker as a subprocess (SubprocessContext: every failure collected, one
process group per worker, the exit code or the signal that ended it).

What a forked worker differs in, and why it does not matter here:
- Its parent is the forkserver, not the launcher. The forkserver dies with the launcher
  (shoal/launch/forkserver_lifetime.py), and the workers with the forkserver.
- Modules imported before the fork read the environment then, not the worker's: the forkserver
  starts with the launcher's environment after `worker_env`, and nothing shoal imports reads a
  rank's own variables (RANK, MASTER_PORT, ...) at import. The same holds for a sitecustomize.
- What a module records at import about its process (shoal.debug.state's pid) it records again in
  a forked child (os.register_at_fork).
- /proc/PID/environ shows the forkserver's environment, so its command line is retitled to the
  `python -m ...` it stands for, with its rank and restart (`title`): `ps` and tests see the worker.

Where the forkserver cannot start or has died (an import of PRELOADS that raises kills it), each worker
starts as a fresh `python` instead, as below.

A user's script (`shoal run`) still starts as its own `python`: it may rely on a fresh
interpreter. SHOAL_FORK_WORKERS=0 starts every worker that way (bench/bench_launch.py compares).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import subprocess
import sys
import traceback
from multiprocessing import forkserver, get_context, reduction, resource_tracker

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from shoal.launch.forkserver_start import PRELOADS, WORKER_SIGNALS, forkable, start


@contextlib.contextmanager
def forked_workers(argv: list[str]):
    """While open, the agent's workers running `python ARGV` are forked from a forkserver that has
    imported what they import: the one local.prestart started, or one started now."""
    module, original = forkable(argv), getattr(api, "get_subprocess_handler", None)
    if module is None or original is None:  # not a shoal worker, or a torch without this seam
        yield
        return
    try:
        start(module, {})  # launch() has put the workers' environment in place
    except OSError:  # no forkserver here (no writable temporary folder for its socket): fresh interpreters
        yield
        return

    def handler(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options=None):
        return _ForkedHandler(entrypoint=entrypoint, args=args, env=env, stdout=stdout, stderr=stderr,
                              local_rank_id=local_rank_id, numa_options=numa_options)

    api.get_subprocess_handler = handler
    try:
        yield
    finally:
        api.get_subprocess_handler = original


def helper_pids() -> set[int]:
    """The launcher's children that are not workers: the forkserver (whose children the forked workers
    are) and multiprocessing's resource tracker."""
    pids = {getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None)}
    return pids - {None}


class _ForkedHandler(SubprocessHandler):
    """torch's SubprocessHandler with the process forked rather than Popen'ed (see the module docstring)."""

    def _popen(self, args: tuple, env: dict[str, str]):
        if tuple(args[:2]) != (sys.executable, "-m") or args[2] not in PRELOADS:  # numactl in front, say
            return super()._popen(args, env)
        stdio = [_Fd(f.fileno() if f else fd) for f, fd in ((self._stdout, 1), (self._stderr, 2))]
        process = get_context("forkserver").Process(
            target=_run_module, args=(list(args[2:]), env, os.getcwd(), stdio), name=f"shoal worker {self.local_rank_id}")
        try:
            process.start()
        except (OSError, EOFError):  # the forkserver is gone (a preload that raised): a fresh interpreter
            return super()._popen(args, env)
        return _Forked(process)

    def close(self, death_sig=None) -> None:
        try:
            super().close(death_sig)
        except ProcessLookupError:  # forked a moment ago: not yet the leader of its own group
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, death_sig or signal.SIGTERM)


class _Forked:
    """What the agent uses of a subprocess.Popen (pid, poll, wait), for a forked worker. Exit codes
    are Popen's: negative for the signal that ended it."""

    def __init__(self, process):
        self._process, self.pid, self.args = process, process.pid, process.name

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode


class _Fd:
    """One of the launcher's file descriptors, handed to the forked worker by the forkserver (SCM_RIGHTS),
    so a worker writes where a Popen'ed one would: to the launcher's stdout and stderr of now."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


def title(argv: list[str], env: dict[str, str]) -> str:
    """'PYTHON -m shoal.train --job F (rank 1 of 2, restart 0)': what `ps` shows for a forked worker."""
    return (f"{sys.executable} -m {' '.join(argv)} (rank {env.get('RANK')} of {env.get('WORLD_SIZE')}, "
            f"restart {env.get('TORCHELASTIC_RESTART_COUNT')})")


def _run_module(argv: list[str], env: dict[str, str], cwd: str, stdio: list[int]) -> None:
    """`python -m MODULE ARGS...` in the forked process, ending as shoal's workers end (exit_worker)."""
    from setproctitle import setproctitle

    from shoal.worker.exit import exit_worker

    os.setsid()  # its own process group, as the agent's Popen(start_new_session=True) makes: it stops workers by group
    for sig, handler in WORKER_SIGNALS.items():
        signal.signal(sig, handler)
    setproctitle(title(argv, env))  # before the environment changes: it moves the strings
    for fd, received in zip((1, 2), stdio):
        os.dup2(received, fd)
        os.close(received)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv, sys.path[0] = list(argv), cwd  # run_module puts the module's file at argv[0], as -m does
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if e.code is None or isinstance(e.code, int) else (print(e.code, file=sys.stderr) or 1)
    except BaseException:  # what the interpreter prints for an uncaught exception, and its exit code
        traceback.print_exc()
        code = 1
    exit_worker(code)

