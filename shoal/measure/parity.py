"""`shoal verify`: every layout against one process, the same model and data (shoal/train/parity.py
says what is compared and why). The references run here, in this process; the layouts in one
launch of N workers (forming a process group costs seconds per worker)."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from shoal.errors import UserError
from shoal.job import resolve
from shoal.train.nonfinite import NonFiniteStep
from shoal.train.parity import OUT_DIRS, Result, compare, config_for, fitting_layouts, in_float64, reference_of


@dataclass
class Verdict:
    nproc: int
    steps: int
    tolerance: float
    out: str
    results: list[Result]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(layout, why it does not fit on nproc ranks) for the default layouts left out."""
    launch_code: int = 0
    """The workers' exit code: nonzero fails the verdict even when the files compare."""

    @property
    def passed(self) -> bool:
        return self.launch_code == 0 and all(r.passed for r in self.results)

    def as_dict(self) -> dict:
        return {"nproc": self.nproc, "steps": self.steps, "tolerance": self.tolerance, "out": self.out,
                "passed": self.passed, "launch_exit_code": self.launch_code,
                "results": [{**asdict(r), "passed": r.passed} for r in self.results],
                "skipped": [{"layout": layout, "reason": why} for layout, why in self.skipped]}


def clear_earlier(folder: Path) -> None:
    """Remove an earlier verify's runs from --out (OUT_DIRS; the CLI refused a folder holding anything
    else). Left there, a layout whose run died, or never started after a worker died, was compared from
    the earlier verify's files and reported as passing, and a layout with checkpoint.every resumed from
    the earlier run's checkpoints."""
    for pattern in OUT_DIRS:
        for old in folder.glob(pattern):
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)


def verify(nproc: int, layouts: list[str] | None, steps: int, tolerance: float, out: str | None,
           say=lambda line: None) -> Verdict:
    """Run the references and the layouts (all that fit on nproc ranks when none are given) and
    compare; every layout mistake is found before anything runs."""
    from shoal.launch.local import launch, prestart, worker_env

    skipped = []
    if not layouts:
        layouts, skipped = fitting_layouts(nproc, steps)
    if not layouts:
        raise UserError("--nproc", nproc, "no default layout fits; pass --layouts")
    for layout in layouts:  # every mistake is said before anything runs
        resolve(config_for(layout, nproc, steps), nproc)
    worker = ["-m", "shoal.train.parity"]
    prestart(worker, nproc)  # the workers' forkserver imports torch beside the references below
    import torch

    from shoal.train.trainer import train

    by_layout = {layout: reference_of(layout, nproc) for layout in layouts}
    references = {ref: f"reference-{i}" for i, ref in enumerate(dict.fromkeys(by_layout.values()))}
    folder = Path(out or tempfile.mkdtemp(prefix="shoal-verify-"))
    clear_earlier(folder)
    # The reference gets the workers' threads: a different thread count splits sums differently
    # (tiny-moe's losses then differed by 2e-4; with one thread each they match to 1e-6).
    torch.set_num_threads(int(worker_env(nproc).get("OMP_NUM_THREADS", torch.get_num_threads())))
    for ref, name in references.items():  # the single-process references, in this process
        ref_cfg = config_for(ref, 1, steps, global_batch=4 * nproc)
        with in_float64(ref_cfg):  # as the layouts run (shoal/train/parity.py says why)
            try:
                train(ref_cfg, folder / name, show=False)
            except NonFiniteStep as e:  # nothing to compare with; a traceback said no more than this
                layout = next(layout for layout, r in by_layout.items() if r == ref)
                raise UserError("--layouts", layout, f"its one-process reference stopped: {e}") from None
    say(f"reference runs done on 1 process; running {len(layouts)} layouts on {nproc} ranks ...")
    code = launch([*worker, str(folder), str(nproc), str(steps), json.dumps(layouts)], nproc)
    results = [compare(layout, folder / f"layout{i}", folder / references[by_layout[layout]], tolerance)
               for i, layout in enumerate(layouts)]
    return Verdict(nproc, steps, tolerance, str(folder), results, skipped, code)
