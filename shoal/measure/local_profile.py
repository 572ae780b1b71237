"""Measure this machine for the planner's `local` profile: matmul rate, memory bandwidth, gloo links.

Run as `python -m shoal.measure.local_profile --out PATH` (the planner does this in a subprocess, so
the planner itself never imports torch.distributed). Takes a few seconds:
- matmul FLOP/s on one thread, bf16 and fp32 (one rank per core is how shoal runs on a CPU);
- copy bandwidth (read + write) of a 64 MiB tensor on one thread;
- the cost of one counted kernel beyond its arithmetic (a forward and backward of the `debug` model
  on 8 tokens over the kernels the planner counts for it), on one thread and on every core;
- causal attention (SDPA) forward and backward, as a fraction of the matmul rate;
- gloo between two local processes: a 4-byte all_reduce for latency, and an all_gather plus a
  reduce_scatter of 4 MiB for bus bandwidth (nccl-tests convention, see _gloo_worker);
- in the same two processes, what DTensor adds to each kernel of a tensor-parallel layer, and to
  each of its sequence-parallel collectives.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path

from shoal.files import write_json


def _best_time(fn, repeats: int) -> float:
    return _best_times([fn], repeats)[0]


def _best_times(fns, repeats: int) -> list[float]:
    """Each function's fastest of `repeats` runs, the runs taken in turn: a load that comes and goes on a
    shared machine (another job, or the other pytest worker) slows each of them alike, so their
    differences stand."""
    for fn in fns:
        fn()  # warm up
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def measure_matmul(dtype_name: str, n: int = 512, repeats: int = 5) -> float:
    import torch

    from shoal.hardware.matmul import matmul_flops

    return matmul_flops(n, getattr(torch, dtype_name), seconds=0.0, min_reps=repeats).best


def measure_copy(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    t = _best_time(lambda: dst.copy_(src), repeats)
    return 2.0 * nbytes / t  # read + write


def measure_kernel_overhead(repeats: int = 20) -> float:
    """Seconds per kernel the planner counts (shoal/planner/compute.py), where the arithmetic is nothing:
    a forward and backward of the `debug` model on 8 tokens, divided by the kernels the planner counts
    for it. What it holds: nn.Module calls, the op dispatcher, autograd recording and its backward
    engine, the Python between them; at tiny hidden sizes these, not FLOPs, set the step time. (A bare
    multiply, 2.3 us here, counts only the dispatch and is ~10x too small for a real layer's ops.)"""
    step, kernels = _debug_step(1, 8)
    return _best_time(step, repeats) / kernels


def _debug_step(batch: int, seq: int, tp_mesh=None):
    """A forward and backward of the `debug` model on batch x seq tokens (sharded by shoal's TP plan
    over tp_mesh, if given), and the kernels the planner counts for it; backward counts twice the forward's."""
    import torch

    from shoal.model.config import get_preset
    from shoal.model.transformer import build_model, cross_entropy
    from shoal.planner.compute import DENSE_LAYER_KERNELS, HEAD_KERNELS

    cfg = get_preset("debug")
    torch.manual_seed(0)
    model = build_model(cfg).train()
    tokens = torch.zeros(batch, seq + 1, dtype=torch.long)
    context = contextlib.nullcontext
    if tp_mesh is not None:
        from torch.distributed.tensor.parallel import loss_parallel

        from shoal.parallel.tensor_parallel import apply_tensor_parallel

        apply_tensor_parallel(model, tp_mesh, sequence_parallel=True)
        context = loss_parallel

    def step():
        with context():
            cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).backward()

    return step, 3 * (cfg.n_layers * DENSE_LAYER_KERNELS + HEAD_KERNELS)


def measure_attention_efficiency(repeats: int = 5) -> float:
    """Causal SDPA forward + backward as a fraction of the fp32 matmul rate, counting the FLOPs the
    planner counts for flash attention (shoal/planner/compute.py: half of 4·B·S²·D forward for the
    causal triangle, 2.5x that backward). The shape is a tiny-to-small layer's: 4 sequences of 256, 4
    heads of 64."""
    import torch
    import torch.nn.functional as F

    b, heads, s, hd = 4, 4, 256, 64
    q, k, v = (torch.randn(b, heads, s, hd, requires_grad=True) for _ in range(3))

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    counted = 3.5 * 0.5 * 4.0 * b * s * s * heads * hd
    return counted / _best_time(step, repeats) / measure_matmul("float32")


GLOO_PAIR_BYTES = 4 * 2**20
"""The buffer of the all_gather + reduce_scatter pair the profile times: the size class of one tiny-to-
small layer's parameters or activations (FSDP and sequence-parallel TP run the pair per layer)."""


def _gloo_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch
    import torch.distributed as dist

    from shoal.comm.renamed import all_gather_single, reduce_scatter_single

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    small = torch.zeros(1)
    full = torch.zeros(GLOO_PAIR_BYTES // 4)
    shard = torch.zeros(full.numel() // world)

    def pair():
        all_gather_single(full, shard)
        reduce_scatter_single(shard, full)

    def best(fn, reps: int) -> float:
        fn()
        dist.barrier()
        times = []
        for _ in range(3):  # best of three rounds: the machine may be shared
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            times.append((time.perf_counter() - t0) / reps)
        return min(times)

    latency_op = best(lambda: dist.all_reduce(small), 50)
    pair_op = best(pair, 4)
    dtensor = _dtensor_kernel_overhead(rank, world)  # both ranks at once: two ranks on two cores, as a tp2 run
    redistribute = _redistribute_overhead(world, best)
    if rank == 0:
        # nccl-tests: all_gather and reduce_scatter each move S (n-1)/n per rank, S the full buffer. The
        # pair, not an all_reduce: gloo's reduce_scatter took ~1.4x an all_reduce of the same buffer
        # here (2-8 MiB, 2 ranks), so an all_reduce's bus bandwidth would flatter every per-layer collective.
        bw = 2 * GLOO_PAIR_BYTES * (world - 1) / world / pair_op
        # A ring all_reduce has 2(n-1) steps; the alpha of the alpha-beta model is per step.
        Path(out_file).write_text(json.dumps({"gloo_busbw": bw, "gloo_latency": latency_op / (2 * (world - 1)),
                                              "tp_kernel_overhead": dtensor, **redistribute}))
    dist.destroy_process_group()


def _dtensor_kernel_overhead(rank: int, world: int, repeats: int = 5) -> float:
    """Seconds DTensor adds to each counted kernel of a tensor-parallel layer: the `debug` model on
    4 x 256 tokens sharded by shoal's TP plan (sequence parallel) over a mesh of this rank alone,
    against the same model unsharded. A one-rank mesh sends nothing, so what is left is the host work:
    sharding propagation, redistribution and the wrapping of every op's inputs and outputs (~100-117 us
    a kernel here, ~10x a plain op's)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    alone = [dist.new_group([r]) for r in range(world)][rank]  # every rank makes every group, in order
    plain, kernels = _debug_step(4, 256)
    sharded, _ = _debug_step(4, 256, tp_mesh=DeviceMesh.from_group(alone, "cpu"))
    plain_s, sharded_s = _best_times([plain, sharded], repeats)  # in turn: a busy spell slows both
    return max(0.0, sharded_s - plain_s) / kernels


REDISTRIBUTE_SIZES = ((4, 256, 64), (4, 256, 1024))
"""[batch, sequence, hidden] of the activations whose sequence-parallel redistribution the profile times:
the `debug` model's (256 KiB in fp32) and a 4 MiB one, for a per-collective and a per-byte cost."""


def _redistribute_overhead(world: int, best) -> dict:
    """What DTensor adds to each sequence-parallel collective beyond the collective itself, as
    `latency + per_byte * full buffer bytes`: the same all-gather (Shard(1) -> Replicate) and
    reduce-scatter (Partial -> Shard(1)) a tensor-parallel layer runs, against the plain pair on flat
    buffers of the same size, at two sizes. What it holds: the redistribution's host work, and the
    copies that gather or scatter along the sequence (dim 1) of a [batch, sequence, hidden] tensor
    need around a collective that works along dim 0 (~3 passes over the buffer here)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    from shoal.comm.renamed import all_gather_single, reduce_scatter_single

    mesh = init_device_mesh("cpu", (world,))
    extra = []
    for b, t, d in REDISTRIBUTE_SIZES:
        local, full = torch.randn(b, t // world, d), torch.randn(b, t, d)
        flat, shard = torch.zeros(full.numel()), torch.zeros(full.numel() // world)

        def plain():
            all_gather_single(flat, shard)
            reduce_scatter_single(shard, flat)

        def sharded():
            for out in (DTensor.from_local(local, mesh, [Shard(1)]).redistribute(mesh, [Replicate()]).to_local(),
                        DTensor.from_local(full, mesh, [Partial()]).redistribute(mesh, [Shard(1)]).to_local()):
                if hasattr(out, "wait"):  # an AsyncCollectiveTensor: the collective is done when waited
                    out.wait()

        extra.append((full.numel() * full.element_size(), max(0.0, best(sharded, 4) - best(plain, 4)) / 2))
    (small, o_small), (large, o_large) = extra
    per_byte = max(0.0, (o_large - o_small) / (large - small))
    return {"tp_redistribute_latency": max(0.0, o_small - per_byte * small), "tp_redistribute_per_byte": per_byte}


def measure_gloo(world: int = 2) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "out.json")
        mp.spawn(_gloo_worker, args=(world, init_file, out_file), nprocs=world, join=True)
        return json.loads(Path(out_file).read_text())


def memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8.0 * 2**30


def _on_every_core(measure_fn):
    """measure_fn with torch's threads on every core, as a single-process run has them: small ops then
    pay OpenMP's fork and join as well (1.1-1.5x the one-thread cost per kernel on this idle machine,
    2-4x while another process holds a core)."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    try:
        return measure_fn()
    finally:
        torch.set_num_threads(1)


def measure() -> dict:
    import torch

    torch.set_num_threads(1)
    profile = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": memory_bytes(),
        "matmul_fp32_flops": measure_matmul("float32"),
        "matmul_bf16_flops": measure_matmul("bfloat16"),
        "copy_bandwidth": measure_copy(),
        "kernel_overhead": measure_kernel_overhead(),
        "kernel_overhead_all_cores": _on_every_core(measure_kernel_overhead),
        "attention_efficiency": measure_attention_efficiency(),
    }
    profile.update(measure_gloo())
    return profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="measure this machine for `shoal plan --gpu local`")
    parser.add_argument("--out", required=True, help="where to write the profile (JSON)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    profile = measure()
    profile["seconds"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, profile, durable=False)  # a run reading the cache meanwhile sees no profile or a whole one
    print(json.dumps(profile, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
