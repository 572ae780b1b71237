"""A run's output is for a person; a reader that went away must not stop the run.

`shoal train ... | head -c 200` closes the pipe after 200 bytes: the next progress line raised
BrokenPipeError, a traceback on rank 0 mid-run (with --nproc), or exit 1 with nothing said (in one
process); `> /dev/full` raised ENOSPC. A process that trains (train_here, a launcher) makes its
stdout and stderr forgiving: the first write that fails points the stream at /dev/null (what
Python's docs advise for SIGPIPE), and training goes on. Commands whose output is the point
(`shoal presets | head`) keep stopping quietly instead (shoal/cli/main.py).
"""

from __future__ import annotations

import os
import sys

_QUIET = (BrokenPipeError, ConnectionResetError)
"""A reader that went away on purpose (`| head`): nothing to say. Any other failure to write (`> /dev/full`,
a full disk under a redirect) is said once on the other stream, where it still works."""


class _Forgiving:
    """A text stream whose writes and flushes survive a reader that went away."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            self._to_devnull(e)
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            self._to_devnull(e)

    def _to_devnull(self, error: OSError) -> None:
        """The stream's descriptor now leads to /dev/null, so what is still buffered (and the
        interpreter's flush at exit) goes nowhere instead of failing again; then, unless the reader
        left on purpose, one line on the other stream (pointed away first: if that one fails too,
        its own line lands in /dev/null here, not back in this stream)."""
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()
        except (OSError, ValueError):
            pass
        if not isinstance(error, _QUIET):
            name, other = ("stdout", sys.stderr) if self is sys.stdout else ("stderr", sys.stdout)
            print(f"shoal: cannot write to {name} ({error.strerror}); training goes on without its progress "
                  "lines (metrics.jsonl has every step)", file=other, flush=True)

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)


def forgive_closed_output() -> None:
    """Make sys.stdout and sys.stderr forgiving in this process (once)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _Forgiving):
            setattr(sys, name, _Forgiving(stream))
