"""A run's output is for a person; a reader that went away must not stop the run.

`shoal train ... | head -c 200` closes the pipe after 200 bytes: the next progress line raised
BrokenPipeError, a traceback on rank 0 mid-run (with --nproc), or exit 1 with nothing said (in one
process). A process that trains (train_here, a launcher) makes its stdout and stderr forgiving: the
first write that finds the reader gone points the stream at /dev/null (what Python's docs advise
for SIGPIPE), and training goes on. Commands whose output is the point (`shoal presets | head`)
keep stopping quietly instead (shoal/cli/main.py).
"""

from __future__ import annotations

import os
import sys

_GONE = (BrokenPipeError, ConnectionResetError)
"""A closed pipe or socket at the other end; other OSErrors (a full disk under a redirect) are not ours to hide."""


class _Forgiving:
    """A text stream whose writes and flushes survive a reader that went away."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except _GONE:
            self._to_devnull()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except _GONE:
            self._to_devnull()

    def _to_devnull(self) -> None:
        """The stream's descriptor now leads to /dev/null, so what is still buffered (and the
        interpreter's flush at exit) goes nowhere instead of failing again."""
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


def forgive_closed_output() -> None:
    """Make sys.stdout and sys.stderr forgiving in this process (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Forgiving):
            setattr(sys, name, _Forgiving(stream))
