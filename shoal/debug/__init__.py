"""The runtime guard: the collective checker, the hang watchdog, stragglers (measuring a machine: shoal.measure).

Any torch.distributed program gets the checker and the watchdog with two lines at its top, under
torchrun or `shoal run --nproc N script.py`:

    import shoal.debug
    shoal.debug.enable(check_collectives=True, hang_timeout_s=60)

The trainer calls the same `enable`, then `progress(step, phase)` as it goes (cheap: two attribute
writes) and `stragglers.step_spread(compute_time_s)` once per step. `SHOAL_CHECK_COLLECTIVES=1|0`
and `SHOAL_HANG_TIMEOUT_S=<s>` in the environment override the arguments (`shoal run
--check-collectives --hang-timeout S` sets them). See docs/debugging.md.

Importing this package does not import torch; `enable()` does.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import time

from shoal.debug.state import HANG_EXIT_CODE, STATE
from shoal.worker.said import a_peer_refused

__all__ = ["enable", "disable", "progress", "watch_ddp", "is_enabled", "CollectiveMismatchError", "HANG_EXIT_CODE"]

DEFAULT_HANG_TIMEOUT_S = 300.0  # the config's default ([debug] hang_timeout_s)
GOODBYE_TIMEOUT_S = 2.0  # how long an exiting rank tries to tell the others; the store may be gone
_active: dict = {}  # monitor, patches, watchdog, excepthook while enabled


def env_settings(check: bool | None, hang_timeout_s: float | None) -> tuple[bool, float]:
    """The settings after the SHOAL_* overrides, which are checked here: `shoal train` calls this
    before it starts any worker, so a bad value is one line from the launcher, not one per rank."""
    import math

    from shoal.config import hang_timeout_problem
    from shoal.errors import UserError
    from shoal.files import check_output_dir

    env_check = os.environ.get("SHOAL_CHECK_COLLECTIVES")
    if env_check is not None and env_check.strip() != "":
        word = env_check.strip().lower()
        if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise UserError("SHOAL_CHECK_COLLECTIVES", env_check, "environment variable must be 1 or 0 (true or false)")
        check = word in ("1", "true", "yes", "on")
    env_hang = os.environ.get("SHOAL_HANG_TIMEOUT_S")
    if env_hang is not None and env_hang.strip() != "":
        try:
            hang_timeout_s = float(env_hang)
        except ValueError:
            hang_timeout_s = math.nan
        if problem := hang_timeout_problem(hang_timeout_s):
            raise UserError("SHOAL_HANG_TIMEOUT_S", env_hang, f"environment variable {problem}")
    if os.environ.get("SHOAL_DEBUG_DIR"):  # where a hang report is written: found now, not during the hang
        check_output_dir("SHOAL_DEBUG_DIR", os.environ["SHOAL_DEBUG_DIR"])
    return bool(check), DEFAULT_HANG_TIMEOUT_S if hang_timeout_s is None else float(hang_timeout_s)


def enable(check_collectives: bool | None = None, hang_timeout_s: float | None = None, *,
           check_timeout_s: float | None = None) -> dict:
    """Install the collective interception; start the watchdog unless hang_timeout_s is 0.

    Call on every rank, before or after `init_process_group`. Calling again changes the settings.
    check_timeout_s: how long the checker waits for a rank to reach a collective before naming
    it (default: hang_timeout_s, or 300 s when the watchdog is off).
    Returns the settings in effect (after the SHOAL_* environment overrides).
    """
    from shoal.debug import intercept
    from shoal.debug.monitor import Monitor
    from shoal.debug.watchdog import Watchdog

    check, hang = env_settings(check_collectives, hang_timeout_s)
    if hang < 0:
        from shoal.errors import UserError
        raise UserError("hang_timeout_s", hang, "must be >= 0 (0 disables the watchdog)")
    check_timeout = float(check_timeout_s) if check_timeout_s is not None else (hang if hang > 0 else DEFAULT_HANG_TIMEOUT_S)
    if not _active:
        monitor = Monitor(check, check_timeout)
        _active.update(monitor=monitor, patches=intercept.install(monitor), watchdog=None, hang=None)
        _active["excepthook"] = sys.excepthook
        sys.excepthook = _excepthook
        atexit.register(_at_exit)
    else:
        _active["monitor"].set_check(check, check_timeout)
    if _active["hang"] != hang:
        if _active["watchdog"] is not None:
            _active["watchdog"].stop()
            _active["watchdog"] = None
        if hang > 0:
            _active["watchdog"] = Watchdog(_active["monitor"], hang)
            _active["watchdog"].start()
        _active["hang"] = hang
    return {"check_collectives": check, "hang_timeout_s": hang, "check_timeout_s": check_timeout}


def disable() -> None:
    """Undo `enable`: every patched function is the original again, the watchdog is stopped."""
    if not _active:
        return
    if _active["watchdog"] is not None:
        _active["watchdog"].stop()
    _active["patches"].undo()
    if _active["monitor"].channel is not None:
        _active["monitor"].channel.close()
    if sys.excepthook is _excepthook:
        sys.excepthook = _active["excepthook"]
    atexit.unregister(_at_exit)
    _active.clear()


def is_enabled() -> bool:
    return bool(_active)


def progress(step: int | None = None, phase: str | None = None) -> None:
    """Mark progress: the watchdog reports a hang only when no rank called this (or finished a
    collective) for hang_timeout_s. Costs two attribute writes; call it freely."""
    if step is not None:
        STATE.step = step
    if phase is not None:
        STATE.phase = phase
    if STATE.inflight is not None and STATE.inflight.status == "issued":
        STATE.inflight = None  # issued and never waited in Python (DDP hooks, futures): it moved on
    STATE.progress_n += 1
    STATE.progress_t = time.time()


def watch_ddp(model) -> None:
    """Route a DistributedDataParallel model's gradient all-reduces through Python so the checker
    and the watchdog see them (DDP's built-in hook runs in C++). Uses torch's own default
    all-reduce hook: same math, same bucketing."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model.register_comm_hook(state=None, hook=default_hooks.allreduce_hook)


def _excepthook(exc_type, exc, tb) -> None:
    text = str(exc).strip().splitlines()
    STATE.exit = f"error: {exc_type.__name__}" + (f": {text[0][:200]}" if text else "")
    _active.get("excepthook", sys.__excepthook__)(exc_type, exc, tb)


def say_goodbye() -> None:
    """Publish that this rank has finished. A job leaving cleanly calls it before its last barrier
    (shoal/train/distributed.py's shutdown), while every rank, rank 0 with the store included, is
    surely still there; at exit, there is then nothing left to say."""
    STATE.exit = STATE.exit or "finished"
    monitor = _active.get("monitor")
    if monitor is None or monitor.channel is None or STATE.rank is None or _active.get("said_goodbye"):
        return
    try:
        from shoal.debug import records

        records.publish(monitor.channel, STATE.rank, STATE.snapshot())
        monitor.channel.set(f"pulse/{STATE.rank}", STATE.pulse())
        _active["said_goodbye"] = True
    except Exception:  # the store may already be gone
        pass


def _at_exit() -> None:
    """Tell the other ranks this one is gone, so they do not mistake it for a straggler; stop our
    threads before the interpreter tears down the C++ objects they use."""
    if _active.get("watchdog") is not None:
        _active["watchdog"].stop(timeout_s=1.0)
    monitor = _active.get("monitor")
    if monitor is None or monitor.channel is None:
        return
    # An exit without shutdown (an error): the store's host may be gone, or go any moment. After a peer's
    # refusal it is on its way out (its store may still take a connection it never answers): nobody waits.
    if not _active.get("said_goodbye") and not a_peer_refused() and monitor.channel.reachable():
        monitor.channel.hurry(GOODBYE_TIMEOUT_S)
        say_goodbye()
    if STATE.rank == 0:
        _wait_for_goodbyes(monitor.channel, int(os.environ.get("WORLD_SIZE", "1")))
    monitor.channel.close()


def _wait_for_goodbyes(channel, world: int) -> None:
    """Rank 0 may host the store (shoal's launcher starts a fresh one there each attempt): if it left
    while another rank was between its check that the store is up and its goodbye, torch's store client
    there would log the failed connect with a C++ stack. So it leaves last, waiting at most
    GOODBYE_TIMEOUT_S for each rank's pulse to say it has exited (a clean run's have already), and not for
    a rank whose process on this host is gone: killed, it says nothing (the survivor of a killed rank waited
    the whole 2 s before its launcher could report)."""
    from shoal.debug import records

    deadline = time.monotonic() + GOODBYE_TIMEOUT_S
    try:
        recs, host = records.read(channel, list(range(1, world))), socket.gethostname()
        keys = [f"pulse/{r}" for r in range(1, world) if not records.gone(recs.get(r), host)]
        while keys and time.monotonic() < deadline:
            have = [k for k, present in zip(keys, channel.present(keys)) if present]
            pulses = dict(zip(have, (channel.get_all(have, timeout_s=GOODBYE_TIMEOUT_S) if have else []) or []))
            if len(pulses) != len(have):
                return
            keys = [k for k in keys if pulses.get(k, b"").split()[-1:] != [b"1"]]  # its last field: exited
            if keys:
                time.sleep(0.05)
    except Exception:  # the store is this process's or the agent's; if it is gone, nobody is left to wait for
        pass


def __getattr__(name: str):
    if name == "CollectiveMismatchError":
        from shoal.debug.checker import CollectiveMismatchError
        return CollectiveMismatchError
    if name == "stragglers":  # `shoal.debug.stragglers.step_spread(...)` after `import shoal.debug`
        import importlib
        return importlib.import_module(f"shoal.debug.{name}")
    raise AttributeError(name)
