"""Runs under `shoal run --nproc 2 compression_worker.py OUT`: every run tests/dist/test_compression_two_ranks.py
compares, in one process group (forming one costs seconds). Each run writes OUT/<name>/."""

import sys
from pathlib import Path

from shoal.config import load_config
from shoal.train.distributed import shutdown
from shoal.train.trainer import train

# Tiny steps on purpose: 2 sequences of 2 tokens give gradients of rank <= 4, and PowerSGD at rank
# 8 is lossless on them (its degenerate setting) while still compressing every matrix (8(m+k) < mk).
# Rank 8, not 4: half of a warm-started Q spans last step's gradients, the other half is refilled
# at random, so P = M Q holds every direction of this step's M well above the fp32 rounding of P
# on the wire (at rank 4 a direction nearly orthogonal to last step's lost 1e-3 by step 8).
BASE = ["model.preset=debug", "train.seq_len=4", "train.global_batch=2", "train.lr=1e-3", "train.warmup_steps=2",
        "train.eval_every=0", "train.eval_batches=1", "train.sample_tokens=0", "train.memory_check=false",
        "parallel.dp_replicate=2", "parallel.dp_shard=1", "parallel.zero=0"]
DDP_RUNS = {  # name -> (steps, extra settings)
    "plain": (10, []),
    "topk_dense": (10, ["parallel.grad_compression=topk", "parallel.topk_density=1", "parallel.topk_warmup=2"]),
    "plain_short": (10, ["train.seq_len=2"]),
    "powersgd_full": (10, ["train.seq_len=2", "parallel.grad_compression=powersgd", "parallel.powersgd_rank=8",
                           "parallel.powersgd_warmup=2"]),
    "bf16": (4, ["parallel.grad_compression=bf16"]),
    "int8": (4, ["parallel.grad_compression=int8"]),
    # ZeRO-1 (its parameter broadcast is not gradient traffic) with 2 micro-batches per rank
    "int8_zero1": (3, ["parallel.grad_compression=int8", "parallel.zero=1", "train.global_batch=4", "train.micro_batch=1"]),
    "topk": (6, ["parallel.grad_compression=topk", "parallel.topk_density=0.1", "parallel.topk_warmup=1",
                 "checkpoint.every=3"]),
    "powersgd": (6, ["parallel.grad_compression=powersgd", "parallel.powersgd_rank=2", "parallel.powersgd_warmup=1",
                     "checkpoint.every=3"]),
}
FSDP_RUNS = {"fsdp_bf16": (4, ["parallel.dp_replicate=1", "parallel.dp_shard=2", "parallel.zero=3",
                               "parallel.grad_compression=bf16"])}
RESUMED = ("topk", "powersgd")  # OUT/<name>_resumed: from <name>'s step-3 checkpoint to step 6


def run_all(out: Path, base: list[str], runs: dict, resumed: tuple[str, ...]) -> None:
    """Every run in one process group (forming one costs seconds), then each of `resumed` again from
    its step-3 checkpoint into OUT/<name>_resumed."""
    for name, (steps, extra) in runs.items():
        train(load_config(None, base + [f"train.steps={steps}"] + extra), out / name, show=False,
              keep_process_group=True)
    for name in resumed:
        steps, extra = runs[name]
        train(load_config(None, base + [f"train.steps={steps}"] + extra), out / f"{name}_resumed", show=False,
              keep_process_group=True, resume=str(out / name / "checkpoints" / "step_00000003"))
    shutdown()


if __name__ == "__main__":
    run_all(Path(sys.argv[1]), BASE, DDP_RUNS | FSDP_RUNS, RESUMED)
