"""How long does a checkpoint stop training, and how fast are saves and loads? Prints, never asserts.

    .venv/bin/python bench/bench_checkpoint.py                 # ~330 MB of model + AdamW state
    .venv/bin/python bench/bench_checkpoint.py --dim 256 --layers 4 --repeats 5

One process, the trainer's own Checkpointer, on the file system of --dir (default: a temporary
directory). Reported:

- blocked: how long `maybe_save` holds up the training loop. Blocking mode writes, fsyncs, hashes
  and commits; async mode only copies the state to host memory.
- save and load throughput (checkpoint bytes / time, including the checksums and, for load,
  verifying every file first) next to a plain copy of the same files (read + write + fsync) and a
  plain read, the floors any checkpoint format pays on this disk; then the ratios, with targets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch


def build(dim: int, layers: int, root: Path, async_save: bool, device: torch.device):
    from shoal.checkpoint.checkpointer import Checkpointer
    from shoal.config import load_config
    from shoal.model.transformer import build_model
    from shoal.job import resolve
    from shoal.parallel.parallel_model import ParallelModel
    from shoal.parallel.mesh import ParallelDims
    from shoal.train.distributed import Runtime
    from shoal.train.optim import build_optimizer

    cfg = load_config(None, ["model.preset=debug", f"model.dim={dim}", f"model.n_layers={layers}",
                             f"model.n_heads={max(1, dim // 64)}", f"model.n_kv_heads={max(1, dim // 128)}",
                             f"model.ffn_hidden={dim * 8 // 3 // 64 * 64}", "train.steps=1000", "checkpoint.every=1",
                             f"checkpoint.dir={root}", "checkpoint.keep=1",
                             f"checkpoint.async={str(async_save).lower()}"])
    job = resolve(cfg, 1)
    rt = Runtime(0, 1, device, ParallelDims.of(job.layout))
    model = build_model(job.model, device=device)
    optimizer = build_optimizer(model, cfg.train)
    for p in model.parameters():  # one step so AdamW has its state
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()

    class Loader:
        def state_dict(self):
            return {"step": 0}

        def load_state_dict(self, state):
            pass

        def identity(self):  # what the tokens are: none here
            return ""

    return Checkpointer(cfg, root, rt, ParallelModel([model], device), optimizer, Loader(), resume="never")


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def plain_copy(src: Path, dst: Path) -> float:
    """Seconds to copy every file of src to dst with an fsync per file, as a save would."""
    dst.mkdir(parents=True)
    t0 = time.perf_counter()
    for f in src.iterdir():
        if f.is_file():
            shutil.copyfile(f, dst / f.name)
            with open(dst / f.name, "rb+") as out:
                os.fsync(out.fileno())
    return time.perf_counter() - t0


def plain_read(src: Path) -> float:
    """Seconds to read every file of src into memory, as a load must."""
    buffer = memoryview(bytearray(64 << 20))
    t0 = time.perf_counter()
    for f in src.iterdir():
        if f.is_file():
            with open(f, "rb", buffering=0) as stream:
                while stream.readinto(buffer):
                    pass
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the model and optimizer state live (default: cuda when there is one); an async save's "
                         "stall is the copy to host memory, so it is a device-to-host copy on a GPU")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    base = Path(tempfile.mkdtemp(prefix="shoal-bench-ckpt-", dir=args.dir))
    try:
        results = {"blocking": [], "async": [], "async_total": [], "load": [], "copy": [], "read": []}
        step = 0
        for mode in ("blocking", "async"):
            ckpt = build(args.dim, args.layers, base / mode, async_save=mode == "async", device=device)
            for _ in range(args.repeats):
                step += 1
                t0 = time.perf_counter()
                ckpt.maybe_save(step)
                blocked = time.perf_counter() - t0
                ckpt.wait()
                results[mode].append(blocked)
                if mode == "async":
                    results["async_total"].append(time.perf_counter() - t0)
            ckpt.close()
        saved = sorted((base / "blocking").glob("step_*"))[-1]
        size = tree_bytes(saved)
        for i in range(args.repeats):
            results["copy"].append(plain_copy(saved, base / f"copy{i}"))
            results["read"].append(plain_read(saved))
            ckpt = build(args.dim, args.layers, base / "load", async_save=False, device=device)
            ckpt.resume_from = str(saved)
            t0 = time.perf_counter()
            assert ckpt.resume() == int(saved.name.split("_")[1])
            results["load"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in results.items()}
        mb = size / 1e6
        print(f"checkpoint: {mb:.0f} MB (model + AdamW state, dim={args.dim}, layers={args.layers}), "
              f"median of {args.repeats}, state on {device}, written to {base}")
        spread = {k: f"{min(v) * 1e3:.0f}-{max(v) * 1e3:.0f} ms" for k, v in results.items()}
        print(f"  training blocked by a blocking save : {med['blocking'] * 1e3:8.1f} ms   ({spread['blocking']})")
        print(f"  training blocked by an async save   : {med['async'] * 1e3:8.1f} ms   ({spread['async']}; "
              f"background write + commit took {med['async_total'] * 1e3:.0f} ms)")
        print(f"  save throughput (write+fsync+hash)  : {mb / med['blocking']:8.0f} MB/s   "
              f"(a plain copy of the same files, read+write+fsync: {mb / med['copy']:.0f} MB/s, {spread['copy']})")
        print(f"  load throughput (verify+read+place) : {mb / med['load']:8.0f} MB/s   "
              f"(a plain read of the same files: {mb / med['read']:.0f} MB/s, {spread['read']}; load {spread['load']})")
        print("ratios (the issue's targets in brackets):")
        print(f"  async stall / blocking save         : {med['async'] / med['blocking']:8.3f}   [<= 0.05]")
        print(f"  save speed / plain copy             : {med['copy'] / med['blocking']:8.2f}   [>= 0.5]")
        print(f"  load speed / plain read             : {med['read'] / med['load']:8.2f}   [>= 0.5]")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
