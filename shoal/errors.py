"""The one exception type for mistakes a user made.

The CLI turns a `UserError` into one line on stderr and exit code 2, before any worker process is
spawned. Internal invariants use `assert`; they are bugs, not user errors.
"""

from __future__ import annotations


class UserError(Exception):
    """A bad setting: names the field, the value that was given and how to fix it."""

    def __init__(self, field: str, value: object, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: {fix}")

    def __reduce__(self):  # raised in a worker process (shoal data prepare), re-raised in its parent
        return UserError, (self.field, self.value, self.fix)


def first_line(e: Exception) -> str:
    """An exception's message cut to its first line (at most 200 characters), for a one-line error."""
    text = str(e).strip().splitlines()
    return text[0][:200] if text else type(e).__name__
