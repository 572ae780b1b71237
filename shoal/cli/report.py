"""`shoal report RUN_DIR [--out DIR] [--partial]`: one HTML page and the figures of a training run."""

from __future__ import annotations

from pathlib import Path

from shoal.cli.argtypes import non_empty
from shoal.files import check_output_dir


def register(sub) -> None:
    p = sub.add_parser("report", help="draw a run's pictures into one self-contained HTML page")
    p.add_argument("run_dir", type=non_empty("runs/first"), help="the --out directory of a `shoal train` run (finished or still running)")
    p.add_argument("--out", type=non_empty("--out runs/first-report"),
                   help="where to write index.html and the figures (default RUN_DIR/report)")
    p.add_argument("--partial", action="store_true", help="report a run that stopped before its last step")
    p.set_defaults(func=run)


def run(args) -> int:
    from shoal.report.html import OWN_FILES
    from shoal.report.run_report import build_report
    from shoal.rundir.names import REPORT

    out = args.out or str(Path(args.run_dir, REPORT))
    if args.out or Path(args.run_dir).is_dir():  # a missing RUN_DIR is load_run's to name
        check_output_dir("--out", out, own=OWN_FILES)  # an earlier report is replaced, nothing else
    page = build_report(Path(args.run_dir), Path(args.out) if args.out else None, allow_partial=args.partial)
    print(f"report: {page}")
    return 0
