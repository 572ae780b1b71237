"""How a launched worker process ends: without interpreter finalization.

Gloo runs each collective on its own threads, and they drop the collective's tensors a moment after
the caller's `wait()` has returned. When the caller was the last step of the program, that drop can
land while the interpreter is finalizing: it needs the GIL, CPython ends any thread that asks for
the GIL then (cpython#87135), and ending a thread inside a C++ destructor aborts the whole process
("terminate called without an active exception", exit -6). A refused two-node run showed it, one
time in ten on a loaded machine: one node exited 2, the other -6.

A worker whose peer died (killed from outside, out of memory, a lost node) fails in its next
collective with the transport's error; `lost_peer` recognizes it so the worker can say so in one line
(exit_codes.LOST_PEER), and the launcher names the worker that failed first (shoal/launch/local.py).

So a worker does what finalization would have done for it before tearing objects down (stops and
joins its threads, runs the atexit hooks, flushes its output) and then leaves with os._exit, before
Gloo's threads can be cut off.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
from typing import NoReturn

# What Gloo and NCCL say when the process at the other end of a connection is gone.
_PEER_GONE = re.compile(r"Connection (reset|closed) by peer|Broken pipe|remote process exited|"
                        r"NCCL communicator was aborted|Connection refused|"
                        r"Connection was likely closed")  # the store, when the peer went during new_group


def lost_peer(error: BaseException) -> str | None:
    """The transport's own words, short, when `error` is a collective failing because a peer is gone."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if not isinstance(error, RuntimeError) or not _PEER_GONE.search(first):
        return None
    return re.sub(r"^\[[^\]]*\.(cc|cpp):\d+\]\s*", "", first).split(". This is typically")[0]


def exit_worker(code: int | None) -> NoReturn:
    # Finalization's own first two steps, in its order. threading._shutdown stops idle executor
    # threads (concurrent.futures registers that with threading, not atexit) and then joins every
    # non-daemon thread. (A first version joined them itself, skipping the executor step; test runs
    # hung then, cause not pinned down.)
    threading._shutdown()
    atexit._run_exitfuncs()  # the hang watchdog's goodbye to the other ranks, logging, torch's own hooks
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to save
            pass
    os._exit(code or 0)
