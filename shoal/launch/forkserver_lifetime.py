"""Imported by the forkserver alone, before anything else it preloads (forkserver_start.py): the
forkserver lives exactly as long as the launcher that started it.

- When the launcher dies, even by SIGKILL, the kernel tells the forkserver at once (its parent-death
  signal, SIGUSR1), which removes the launcher's folders in /tmp that the launcher could not (its
  socket's, the workers' said/ folder) and exits; the workers forked from it die with it
  (shoal/worker/process.py). Left to itself it would notice its pipe from the launcher close, then
  spend ~2.5 s finalizing torch while the orphaned workers train on.
- A SIGTERM sent to every process of a job (Slurm's scancel, a container's stop) is for the workers,
  which save the step they stop after (shoal/train/preempt.py). Were the forkserver to die of it, the
  workers would get SIGKILL first. So it ignores SIGTERM, and SIGINT, which the launcher answers (a
  Ctrl-C while this process imports torch would otherwise print a KeyboardInterrupt traceback).
A forked worker puts all three back as a fresh interpreter has them (forkserver_start.WORKER_SIGNALS).
It imports nothing heavy: it must be in place before the forkserver spends seconds importing torch.
"""

import glob
import os
import shutil
import signal
from multiprocessing import forkserver

from shoal.launch.forkserver_start import PARENT_DEATH, WORKER_SIGNALS
from shoal.worker.process import die_with_parent
from shoal.worker.said import said_pattern

SAID = said_pattern(os.getppid())
"""The launcher's said/ folders, by name: it may make one after this process started. Worked out now, not
in the handler, which must take no lock (tempfile.gettempdir does): it may interrupt the code holding it."""


def _launcher_gone(signum, frame) -> None:
    signal.signal(PARENT_DEATH, signal.SIG_IGN)  # once: a second signal must not interrupt the removal
    socket = getattr(forkserver._forkserver, "_forkserver_address", None)
    for folder in [*glob.glob(SAID), *([os.path.dirname(socket)] if isinstance(socket, str) else [])]:
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


for ignored in WORKER_SIGNALS.keys() - {PARENT_DEATH}:  # SIGTERM is the workers'; Ctrl-C the launcher's to say
    signal.signal(ignored, signal.SIG_IGN)
signal.signal(PARENT_DEATH, _launcher_gone)
die_with_parent(PARENT_DEATH)
