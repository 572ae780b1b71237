"""Runs under `shoal run --nproc 4 compression_fsdp_worker.py OUT`: the FSDP2 runs that
tests/dist/test_compression_fsdp.py compares, in one process group. Each run writes OUT/<name>/."""

import sys
from pathlib import Path

from compression_worker import run_all  # this script's folder is on sys.path

# HSDP: 2 replicas x 2 shards, zero=3. Two tokens per rank and step: the averaged gradient has rank
# <= 8, so PowerSGD at rank 16 is lossless (its degenerate setting, with 2x headroom for the warm
# start as in compression_worker.py) while still compressing most shards (16(m+k) < mk; the 16x64
# shards of wk and wv go plain).
BASE = ["model.preset=debug", "train.seq_len=2", "train.global_batch=4", "train.lr=1e-3", "train.warmup_steps=2",
        "train.eval_every=0", "train.eval_batches=1", "train.sample_tokens=0", "train.memory_check=false",
        "parallel.dp_replicate=2", "parallel.dp_shard=2", "parallel.zero=3"]
RUNS = {  # name -> (steps, extra settings)
    "plain": (8, []),
    "topk_dense": (8, ["parallel.grad_compression=topk", "parallel.topk_density=1", "parallel.topk_warmup=2"]),
    "powersgd_full": (8, ["parallel.grad_compression=powersgd", "parallel.powersgd_rank=16", "parallel.powersgd_warmup=2"]),
    "int8": (3, ["parallel.grad_compression=int8", "train.seq_len=8"]),
    "bf16": (3, ["parallel.grad_compression=bf16", "train.seq_len=8"]),  # native HSDP, reduce dtype bf16
    # pure FSDP over 4 ranks: int8 replaces the reduce-scatter itself
    "int8_fsdp": (3, ["parallel.grad_compression=int8", "train.seq_len=8", "parallel.dp_replicate=1",
                      "parallel.dp_shard=4", "parallel.zero=2"]),
    "topk": (6, ["parallel.grad_compression=topk", "parallel.topk_density=0.1", "parallel.topk_warmup=1",
                 "train.seq_len=8", "checkpoint.every=3"]),
    "powersgd": (6, ["parallel.grad_compression=powersgd", "parallel.powersgd_rank=2", "parallel.powersgd_warmup=1",
                     "train.seq_len=8", "checkpoint.every=3"]),
}
RESUMED = ("topk", "powersgd")  # OUT/<name>_resumed: from <name>'s step-3 checkpoint to step 6

if __name__ == "__main__":
    run_all(Path(sys.argv[1]), BASE, RUNS, RESUMED)
