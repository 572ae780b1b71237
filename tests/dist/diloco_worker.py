"""Runs under `shoal run --nproc 2 diloco_worker.py OUT`: every run tests/dist/test_diloco.py compares,
in one process group (forming one costs seconds). Two replica groups of one rank each
(dp_replicate=2); each run writes OUT/<name>/."""

import sys
from pathlib import Path

from shoal.config import load_config
from shoal.train.distributed import shutdown
from shoal.train.trainer import train

BASE = ["model.preset=debug", "train.seq_len=16", "train.global_batch=4", "train.eval_every=0", "train.eval_batches=1",
        "train.sample_tokens=0", "train.memory_check=false", "parallel.dp_replicate=2", "parallel.dp_shard=1"]
# Plain SGD without clipping: DiLoCo at H=1, outer lr 1 and momentum 0 averages the groups' SGD
# steps, which is data-parallel SGD (clipping would clip each group's norm, not the mean's). The
# two differ by fp32 rounding only: a few ulp of the norm gains (~1.0) at lr 0.1 (at lr 0.5, SGD
# amplified it to 2e-6 in 10 steps).
SGD = ["train.optimizer=sgd", "train.lr=0.1", "train.grad_clip=0"]
H1 = ["parallel.diloco_inner_steps=1", "parallel.diloco_outer_lr=1", "parallel.diloco_outer_momentum=0"]
RUNS = {  # name -> (steps, extra settings)
    "plain_sgd": (10, SGD),
    "diloco_h1_sgd": (10, SGD + H1),
    "plain": (10, []),
    "diloco_h5": (10, ["parallel.diloco_inner_steps=5"]),
    "stream": (8, ["parallel.diloco_inner_steps=4", "parallel.diloco_fragments=2", "checkpoint.every=3"]),
    # tau = 2: fragment 1 sent at step 2 is applied at the save after step 3, fragment 0 sent at 4 at step 6
    "overlap": (8, ["parallel.diloco_inner_steps=4", "parallel.diloco_fragments=2", "checkpoint.every=3",
                    "parallel.diloco_overlap_steps=2"]),
    "stream_int8": (2, ["parallel.diloco_inner_steps=2", "parallel.diloco_fragments=2", "parallel.diloco_quantize=int8"]),
    "stream_bf16": (2, ["parallel.diloco_inner_steps=2", "parallel.diloco_fragments=2", "parallel.diloco_quantize=bf16"]),
    "stream_fp4": (2, ["parallel.diloco_inner_steps=2", "parallel.diloco_fragments=2", "parallel.diloco_quantize=fp4"]),
}


def config(steps: int, extra: list[str]):
    return load_config(None, BASE + [f"train.steps={steps}"] + extra)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name, (steps, extra) in RUNS.items():
        train(config(steps, extra), out / name, show=False, keep_process_group=True)
    # From step 3: mid-round, when the two groups' weights and AdamW states differ.
    train(config(*RUNS["stream"]), out / "stream_resumed", show=False, keep_process_group=True,
          resume=str(out / "stream" / "checkpoints" / "step_00000003"))
    train(config(*RUNS["overlap"]), out / "overlap_resumed", show=False, keep_process_group=True,
          resume=str(out / "overlap" / "checkpoints" / "step_00000003"))
    shutdown()
