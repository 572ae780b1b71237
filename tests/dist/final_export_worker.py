"""Runs under `shoal run --nproc 2`: trains each layout for a few steps with a checkpoint at the last
step, and records what rank 0 held during the end-of-run export (final_export.LiveBytes, measured in
the real export path). Rank 0 writes OUT/export.json."""

import json
import sys
from pathlib import Path

import torch

import shoal.train.trainer as trainer
from shoal.train.parity import config_for

STEPS = 2
MEASURED = []


def measured_export(*args, **kwargs):
    live = real_export(*args, **kwargs)
    MEASURED.append({"peak": dict(live.peak), "alive_after": dict(live.now)})
    return live


if __name__ == "__main__":
    out, layouts = Path(sys.argv[1]), sys.argv[2].split(";")
    real_export, trainer.write_final_weights = trainer.write_final_weights, measured_export
    results = {}
    for i, layout in enumerate(layouts):
        cfg = config_for(layout, 2, steps=STEPS)
        cfg.checkpoint.every = STEPS  # the DCP checkpoint of the same final weights, to compare the export with
        trainer.train(cfg, out / f"layout{i}", show=False, keep_process_group=True)
        results[layout] = {"dir": str(out / f"layout{i}"), **MEASURED.pop()}
    if torch.distributed.get_rank() == 0:
        (out / "export.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()
