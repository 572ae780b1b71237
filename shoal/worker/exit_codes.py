"""How a shoal process ends: the one table of exit codes (the README lists the same).

A launcher passes a worker's code on when the worker said why in its own line (USER_ERROR,
NONFINITE, PREEMPTED); `shoal slurm` scripts requeue on PREEMPTED; a rank that gave up on a
peer exits LOST_PEER or HANG, and the launcher looks past those to the rank that failed first.
"""

DONE = 0
USER_ERROR = 2
"""A mistake in what the user asked for: one line naming the field, the value and a fix."""
NONFINITE = 3
"""A NaN or infinite loss or gradient norm stopped the run (train.on_nonfinite=stop)."""
PREEMPTED = 75
"""EX_TEMPFAIL ("try again later"): stopped by SIGTERM after a checkpoint; the same command resumes."""
LOST_PEER = 76
"""EX_PROTOCOL: this rank lost a peer that went first (the other end went away)."""
HANG = 124
"""After a hang report, like timeout(1): gave up waiting."""
INTERRUPTED = 130
"""128 + SIGINT: Ctrl-C."""
TERMINATED = 143
"""128 + SIGTERM, before a checkpoint could be written."""

SAID_WHY = (USER_ERROR, NONFINITE, PREEMPTED)
"""Worker exit codes that follow the worker's own one-line explanation: a launcher adds nothing."""
