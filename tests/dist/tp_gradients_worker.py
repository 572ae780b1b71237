"""Runs under `shoal run --nproc 2`: one tp2 step of the debug model through ParallelModel, then
counts the all-reduces that the gradient norm and AdamW's step issue. Writes OUT/rank<R>.json."""

import json
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from shoal.comm import patch
from shoal.config import load_config
from shoal.job import resolve
from shoal.train.distributed import init_runtime, shutdown
from shoal.train.optim import build_optimizer, clip_grad_norm
from shoal.train.trainer import build_parallel_model


class CountAllReduces(patch.Observer):
    doors = ("pg", "funcol")
    count = 0

    def before(self, door, name, target, args, kwargs):
        CountAllReduces.count += name in ("allreduce", "all_reduce")


job = resolve(load_config(None, ["model.preset=debug", "parallel.tp=2", "parallel.zero=0", "train.micro_batch=4",
                                 "train.global_batch=8", "train.seq_len=32"]), 2)
rt = init_runtime(job)
pm = build_parallel_model(job, rt)
optimizer = build_optimizer(pm, job.cfg.train, rt, 0)
tokens = torch.randint(0, job.model.vocab_size, (8, 33), generator=torch.Generator().manual_seed(0))
pm.forward_backward([(tokens[:4, :-1], tokens[:4, 1:]), (tokens[4:, :-1], tokens[4:, 1:])])
partial = [i for i, p in enumerate(pm.parameters())
           if isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements)]
observer = CountAllReduces()
patch.attach(observer)
clip_grad_norm(list(pm.parameters()), 1.0, rt)
optimizer.step()
patch.detach(observer)
Path(sys.argv[1], f"rank{rt.rank}.json").write_text(json.dumps({"partial": partial, "all_reduces": observer.count}))
shutdown()
