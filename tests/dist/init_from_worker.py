"""Runs under `shoal run --nproc 2`: starts one run from each pretrained folder (model.init_from) in one
process group, with the layout and settings the test gives, and records how many bytes of the folder's
tensors each rank held at once while loading. Each rank writes OUT/loading-rank<R>.json."""

import json
import sys
from pathlib import Path

import torch

import shoal.checkpoint.pretrained as pretrained
from shoal.checkpoint.final_export import LiveBytes
from shoal.config import load_config
from shoal.train.trainer import train

LIVE = []


def measured(open_weights):
    def wrapped(*args, **kwargs):
        weights, live = open_weights(*args, **kwargs), LiveBytes()
        read = weights.read
        weights.read = lambda *a, **k: live.track(read(*a, **k))
        LIVE.append(live)
        return weights
    return wrapped


if __name__ == "__main__":
    out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    pretrained.open_weights = measured(pretrained.open_weights)
    peaks = {}
    for name, sets in cases.items():
        train(load_config(None, sets), out / name, show=False, keep_process_group=True)
        peaks[name] = LIVE.pop().peak.get("cpu", 0)
    (out / f"loading-rank{torch.distributed.get_rank()}.json").write_text(json.dumps(peaks))
    torch.distributed.destroy_process_group()
