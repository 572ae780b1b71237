"""The baseline for bench_vs_plain.py: a minimal hand-written torch.distributed training loop.

The same model code and shapes as shoal's run, wrapped in plain DDP or per-block FSDP2, with
AdamW and no framework around it. Rank 0 prints the median tokens/s as one JSON line.
Run under torchrun (bench_vs_plain.py starts it through shoal's launcher).
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from shoal.model.config import get_preset
from shoal.model.transformer import build_model, cross_entropy

p = argparse.ArgumentParser()
p.add_argument("--wrap", choices=["ddp", "fsdp"], required=True)
p.add_argument("--preset", default="tiny")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--warmup", type=int, default=5)
p.add_argument("--micro-batch", type=int, default=8)
p.add_argument("--seq-len", type=int, default=256)
args = p.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = build_model(get_preset(args.preset), seed=0)
if args.wrap == "ddp":
    model = DistributedDataParallel(model)
else:
    for block in model.layers.values():
        fully_shard(block)
    fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
vocab = get_preset(args.preset).vocab_size
times = []
for step in range(args.steps):
    # Timed as shoal times `step_time_s` (shoal/train/trainer.py): from taking the batch to zero_grad.
    t0 = time.perf_counter()
    tokens = torch.randint(0, vocab, (args.micro_batch, args.seq_len + 1))
    loss = cross_entropy(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
    # What any loop does to log a global loss; shoal does it too, after its timer, so here as well.
    dist.all_reduce(loss.detach())
if dist.get_rank() == 0:
    per_step = statistics.median(times[args.warmup:])
    print(json.dumps({"tokens_per_s": args.micro_batch * args.seq_len * dist.get_world_size() / per_step}))
dist.barrier()  # both ranks done before gloo tears its threads down (an abort otherwise, now and then)
dist.destroy_process_group()
