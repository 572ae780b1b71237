"""`python -m shoal.debug.bootstrap script.py [args...]`: enable shoal.debug, then run the script.

What `shoal run --check-collectives/--hang-timeout` starts on each worker: the settings come from
SHOAL_CHECK_COLLECTIVES and SHOAL_HANG_TIMEOUT_S; the script runs as `__main__` with its own argv.
"""

from __future__ import annotations

import runpy
import sys

import shoal.debug
from shoal.worker.exit import exit_worker


def main() -> int:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m shoal.debug.bootstrap script.py [args...]")
    shoal.debug.enable()
    sys.argv = sys.argv[1:]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as e:  # the script's own sys.exit(code)
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_worker(main())  # not through finalization: shoal/worker/exit.py says why
