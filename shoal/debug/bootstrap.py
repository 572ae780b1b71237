"""`python -m shoal.debug.bootstrap script.py [args...]`: enable shoal.debug, then run the script.

What `shoal run --check-collectives/--hang-timeout` starts on each worker: the settings come from
SHOAL_CHECK_COLLECTIVES and SHOAL_HANG_TIMEOUT_S; the script runs as `__main__` with its own argv.
"""

from __future__ import annotations

import runpy
import sys

import shoal.debug


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m shoal.debug.bootstrap script.py [args...]")
    shoal.debug.enable()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
