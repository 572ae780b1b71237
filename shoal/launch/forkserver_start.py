"""Starting the forkserver shoal's own workers are forked from (shoal/launch/forked.py), without torch.

The forkserver spends ~3 s of CPU importing torch and the training loop before it can fork the first
worker. Started when the workers are (launch()), all of it came after the launcher's own work: its
checks, its corpus, its own torch import, verify's single-process references. A launcher that knows
it will launch starts it early instead (local.prestart), so on a machine with a core to spare the two
import at once; one whose checks then refuse the launch stops it (stop). This module imports nothing
heavy, so a launcher can start the forkserver before it imports torch itself.
"""

from __future__ import annotations

import os
import signal
from multiprocessing import forkserver, get_context

FORK_ENV = "SHOAL_FORK_WORKERS"
"""0: every worker starts as a fresh interpreter."""

PARENT_DEATH = signal.SIGUSR1
"""The signal the kernel sends the forkserver when its launcher dies (forkserver_lifetime.py)."""

WORKER_SIGNALS = {PARENT_DEATH: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
"""Every signal the forkserver handles its own way (forkserver_lifetime.py: PARENT_DEATH removes the launcher's
folders; SIGTERM and SIGINT are ignored), with the handler a fresh interpreter has, which a forked worker puts back."""

PRELOADS = {  # a worker module -> what it imports before its first step (never the module itself:
    # runpy warns when the module it runs as __main__ was imported already)
    "shoal.train": ("shoal.train.process", "shoal.train.trainer", "shoal.job"),
    "shoal.train.parity": ("shoal.train.trainer", "shoal.config", "shoal.job", "shoal.rundir.metrics"),
    "shoal.measure.commbench": ("torch.distributed", "shoal.comm.ops", "shoal.comm.renamed", "shoal.hardware.matmul"),
}


def forkable(argv: list[str]) -> str | None:
    """The module of `python ARGV` when it is one of shoal's workers and forking is on."""
    if os.environ.get(FORK_ENV, "1") == "0" or len(argv) < 2 or argv[0] != "-m" or argv[1] not in PRELOADS:
        return None
    return argv[1]


def start(module: str, env: dict[str, str]) -> None:
    """Start the forkserver for `module`'s workers, with `env` over this process's environment (what the
    modules it imports may read then), unless one is running. Raises OSError where it cannot start."""
    # forkserver_lifetime first: the forkserver dies with the launcher even while it imports torch
    preload = ["shoal.launch.forkserver_lifetime", "setproctitle", *PRELOADS[module], "shoal.launch.forked"]
    get_context("forkserver").set_forkserver_preload(preload)
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # the forkserver inherits this process's environment as it is now
    try:
        forkserver.ensure_running()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def stop() -> None:
    """Stop the forkserver this process started, if any: a launch refused after local.prestart has no workers
    for it. The command's process exits then and takes it along (forkserver_lifetime.py), but one that goes on,
    a test calling `shoal train` in-process, would keep it, with torch imported, until it exits. Killed, not
    asked: it may be importing torch, which it would finish first. Nothing of the launch's is in /tmp yet
    but the socket, which multiprocessing's own stop removes (ForkServer._stop_unlocked, as its tests stop it)."""
    server = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is None or not hasattr(server, "_stop_unlocked"):
            return
        os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop_unlocked()
