"""Imported by the forkserver alone, before anything else it preloads (shoal/launch/forked.py): the
forkserver lives exactly as long as the launcher that started it.

- It dies the moment the launcher does, and the workers forked from it die with it
  (shoal/worker/process.py). Left to itself it would notice its pipe from the launcher close, then
  spend ~2.5 s finalizing torch while the orphaned workers train on.
- A SIGTERM sent to every process of a job (Slurm's scancel, a container's stop) is for the workers,
  which save the step they stop after (shoal/train/preempt.py). Were the forkserver to die of it, the
  workers would get SIGKILL first. So it ignores SIGTERM; forked workers get its default back.
"""

import signal

from shoal.worker.process import die_with_parent

die_with_parent()
signal.signal(signal.SIGTERM, signal.SIG_IGN)
