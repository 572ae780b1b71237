"""One device trains a ~1B Llama in bf16: tokens/s and MFU, eager vs compiled, with and without
selective recompute, each at the largest micro-batch that fits, beside the planner's prediction
for the same layout on the device's catalog entry (h100 when the catalog does not know it; issue 17).

    python bench/gpu_mfu.py                      # all four variants, seq 4096, micro-batch searched
    python bench/gpu_mfu.py --compile compiled --recompute selective --micro-batch 4 --profile
    python bench/gpu_mfu.py --tiny               # CPU: a debug-sized model, 2 steps (tests run this)

The model is Llama 3.2 1B's shape: 16 layers, dim 2048, 32 heads (8 KV heads), SwiGLU 8192, the
llama3 vocabulary (128,256) with tied embeddings: 1.24B parameters. MFU follows DESIGN.md
(6·N + 12·L·H·S model FLOPs per token, recompute not counted) against the device's datasheet
peak (shoal/hardware/peak.py: 989 TFLOP/s dense bf16 on H100 SXM). The step is the trainer's own:
parallelize() (AC, compile), ParallelModel.forward_backward (autocast, attention kernels), gradient
clipping and AdamW (fused on CUDA); the data are random tokens (the loader is not what is measured).

The micro-batch search doubles from 1 until a step runs out of memory (torch.OutOfMemoryError) or
reaches --max-micro-batch. Compiled variants start from the eager variant's answer and halve on
OOM instead of searching from 1: every new shape is a fresh compilation (about a minute).
--profile adds a torch.profiler summary after each variant: the top kernels, their share of kernel
time, the kernel families' shares and the device's idle time.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from shoal.config import load_config  # noqa: E402
from shoal.job import resolve  # noqa: E402
from shoal.hardware.peak import job_peak  # noqa: E402
from shoal.model.analytics import flops_per_token, param_counts  # noqa: E402
from shoal.model.transformer import build_model  # noqa: E402
from shoal.parallel.parallelize import parallelize  # noqa: E402
from shoal.train.memory import peak_mem_bytes  # noqa: E402
from shoal.train.optim import build_optimizer, clip_grad_norm  # noqa: E402

LLAMA_1B = ["model.preset=llama3-8b", "model.dim=2048", "model.n_layers=16", "model.n_heads=32",
            "model.n_kv_heads=8", "model.ffn_hidden=8192", "model.tie_embeddings=true"]
TINY = ["model.preset=debug"]
GiB = 2**30


@dataclass
class Result:
    variant: str
    micro_batch: int
    tokens_per_s: float
    mfu: float
    peak_mem_gib: float
    attention: str
    plan_tokens_per_s: float
    plan_mfu: float
    plan_mem_gib: float
    plan_fits: bool


def job_for(model: list[str], seq_len: int, micro_batch: int, recompute: str, compiled: bool, precision: str):
    cfg = load_config(None, model + [f"train.seq_len={seq_len}", f"train.global_batch={micro_batch}",
                                     f"train.micro_batch={micro_batch}", f"train.activation_checkpoint={recompute}",
                                     f"train.compile={str(compiled).lower()}", f"train.precision={precision}",
                                     "train.memory_check=false"])
    return resolve(cfg, 1)


class Runner:
    """One variant's model and optimizer on one device; `step(mb)` runs one training step."""

    def __init__(self, job, device: torch.device):
        self.job, self.device = job, device
        self.pm = parallelize(build_model(job.model, device="meta").train(), job, None, None, device)
        self.optimizer = build_optimizer(self.pm, job.cfg.train)
        self.params = list(self.pm.parameters())

    def step(self, micro_batch: int) -> None:
        t, vocab = self.job.cfg.train, self.job.model.vocab_size
        tokens = torch.randint(0, vocab, (micro_batch, t.seq_len + 1), device=self.device)
        self.pm.forward_backward([(tokens[:, :-1], tokens[:, 1:])])
        clip_grad_norm(self.params, t.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def fits(self, micro_batch: int) -> bool:
        try:
            self.step(micro_batch)
            sync(self.device)
            return True
        except torch.OutOfMemoryError:
            self.optimizer.zero_grad(set_to_none=True)
            free(self.device)
            return False

    def close(self) -> None:
        del self.pm, self.optimizer, self.params
        free(self.device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def largest_micro_batch(runner: Runner, start: int, limit: int, search_up: bool) -> int:
    """Double from `start` while a step fits (search_up), else halve from it until one fits; 0: none fits."""
    if not search_up:
        mb = start
        while mb >= 1 and not runner.fits(mb):
            mb //= 2
        return mb
    best, mb = 0, start
    while mb <= limit and runner.fits(mb):
        best, mb = mb, mb * 2
    return best


def measure(runner: Runner, micro_batch: int, steps: int, warmup: int) -> tuple[float, float]:
    """(seconds per step, peak memory bytes) over `steps` timed steps after `warmup` untimed ones."""
    for _ in range(warmup):
        runner.step(micro_batch)
    sync(runner.device)
    if runner.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(runner.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        runner.step(micro_batch)
    sync(runner.device)
    return (time.perf_counter() - t0) / steps, peak_mem_bytes(runner.device)


def planner_gpu(device: torch.device) -> str:
    """The catalog entry the planner predicts for: the device's own where the catalog knows it, else h100."""
    from shoal.hardware.lookup import lookup_gpu

    entry = lookup_gpu(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    return entry.name if entry else "h100"


def planner_prediction(job, gpu: str):
    """The planner's plan for this layout (one GPU, this micro-batch) on `gpu`: tokens/s, MFU, memory."""
    from shoal.planner.evaluate import evaluate
    from shoal.hardware.lookup import get_gpu
    from shoal.planner.workload import Cluster, Workload

    t = job.cfg.train
    hw = get_gpu(gpu)
    workload = Workload(job.model, t.seq_len, t.global_batch, precision=t.precision, attention="flash")
    return evaluate(workload, job.layout, Cluster(hw, 1, hw.gpus_per_node), check=False)


# Kernel families by name, for "what limits it": cuBLAS's Hopper GEMMs are nvjet/sm90 xmma/cutlass
# kernels; cuDNN's and FlashAttention's fused attention say sdpa/fmha/flash; inductor's fused
# element-wise kernels are triton_*; the loss's softmax, AdamW's multi-tensor kernels, copies.
FAMILIES = (("matmul", ("nvjet", "gemm", "xmma", "cutlass", "cublas")),
            ("attention", ("sdpa", "fmha", "flash", "attention")),
            ("fused element-wise (triton)", ("triton",)),
            ("softmax / cross-entropy", ("softmax", "nll_loss", "cross_entropy")),
            ("optimizer", ("multi_tensor", "adam", "foreach")),
            ("copies", ("memcpy", "memset", "copy")))


def family(kernel: str) -> str:
    name = kernel.lower()
    return next((f for f, keys in FAMILIES if any(k in name for k in keys)), "other element-wise / reductions")


def profile(runner: Runner, micro_batch: int, top: int = 15) -> str:
    """torch.profiler over 3 steps: the top kernels (CUDA) or operators (CPU) by self time, their
    share, and on CUDA the share of each kernel family."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile as torch_profile

    on_device = runner.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    runner.step(micro_batch)
    sync(runner.device)
    t0 = time.perf_counter()
    with torch_profile(activities=activities) as prof:
        for _ in range(3):
            runner.step(micro_batch)
        sync(runner.device)
    wall_ms = (time.perf_counter() - t0) / 3 * 1e3
    if on_device:  # kernels only: an operator's self device time is its kernels' time counted again
        # ("Optimizer.step#AdamW.step" is an annotation on the device timeline, not a kernel)
        events = [e for e in prof.key_averages()
                  if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0 and "#" not in e.key]
        self_time = lambda e: e.self_device_time_total  # noqa: E731
    else:
        events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
        self_time = lambda e: e.self_cpu_time_total  # noqa: E731
    total = sum(self_time(e) for e in events) or 1
    lines = [f"profile ({'kernel' if on_device else 'CPU operator'} self time over 3 steps: {total / 3e3:.1f} ms "
             f"per step, {wall_ms:.1f} ms wall under the profiler): top {top}"]
    for e in sorted(events, key=self_time, reverse=True)[:top]:
        lines.append(f"  {self_time(e) / total:6.1%}  {self_time(e) / 3e3:9.2f} ms/step  {e.count // 3:>5}x  {e.key[:90]}")
    if on_device:
        shares: dict[str, float] = {}
        for e in events:
            shares[family(e.key)] = shares.get(family(e.key), 0.0) + self_time(e)
        lines.append("  by family: " + ", ".join(f"{f} {t / total:.1%}" for f, t in
                                                 sorted(shares.items(), key=lambda kv: -kv[1])))
        lines.append(f"  device idle between kernels: {max(0.0, 1 - total / 3e3 / wall_ms):.1%} of the wall time")
    return "\n".join(lines)


def run_variant(args, device, recompute: str, compiled: bool, start_mb: int, search_up: bool) -> tuple[Result | None, Runner | None]:
    model = TINY if args.tiny else LLAMA_1B
    precision = "fp32" if args.tiny and device.type == "cpu" else "bf16"
    name = f"{'compiled' if compiled else 'eager'}, recompute={recompute}"
    runner = Runner(job_for(model, args.seq_len, start_mb, recompute, compiled, precision), device)
    if args.micro_batch:  # as asked, or not at all (at the edge, the allocator's fragmentation decides)
        mb = args.micro_batch if runner.fits(args.micro_batch) else 0
    else:
        mb = largest_micro_batch(runner, start_mb, args.max_micro_batch, search_up)
    if mb == 0:
        print(f"{name}: micro-batch {args.micro_batch or 1} runs out of memory", flush=True)
        runner.close()
        return None, None
    runner.job = job_for(model, args.seq_len, mb, recompute, compiled, precision)
    step_s, mem = measure(runner, mb, args.steps, args.warmup)
    job = runner.job
    tokens_per_s = mb * args.seq_len / step_s
    peak = job_peak(device, precision, 1, 1)
    gpu = planner_gpu(device)
    plan = planner_prediction(job, gpu)
    r = Result(name, mb, tokens_per_s, flops_per_token(job.model, args.seq_len) * tokens_per_s / peak.flops,
               mem / GiB, runner.pm.attention, plan.tokens_per_s, plan.mfu, plan.memory.total / GiB, plan.fits)
    print(f"{name}: micro-batch {mb}, {step_s * 1e3:.1f} ms/step, {tokens_per_s:,.0f} tokens/s, MFU {r.mfu:.1%}, "
          f"peak {r.peak_mem_gib:.1f} GiB | planner on {gpu}: {r.plan_tokens_per_s:,.0f} tokens/s, "
          f"MFU {r.plan_mfu:.1%}, {r.plan_mem_gib:.1f} GiB", flush=True)
    return r, runner


def table(results: list[Result], gpu: str) -> str:
    """Measured beside predicted, one row per variant, measured/predicted ratios last."""
    lines = [f"{'variant':<30} {'mb':>3} {'tokens/s':>9} {'MFU':>6} {'GiB':>6} | planner on {gpu}: "
             f"{'tokens/s':>9} {'MFU':>6} {'GiB':>6} | meas/plan tok/s, mem"]
    for r in results:
        lines.append(f"{r.variant:<30} {r.micro_batch:>3} {r.tokens_per_s:>9,.0f} {r.mfu:>6.1%} {r.peak_mem_gib:>6.1f} | "
                     f"{'':>{len(gpu) + 13}}{r.plan_tokens_per_s:>9,.0f} {r.plan_mfu:>6.1%} {r.plan_mem_gib:>6.1f} | "
                     f"{r.tokens_per_s / r.plan_tokens_per_s:.2f}, {r.peak_mem_gib / r.plan_mem_gib:.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation, allocator)")
    p.add_argument("--compile", default="eager,compiled", help="eager, compiled or both (comma-separated)")
    p.add_argument("--recompute", default="none,selective", help="activation checkpointing modes to try")
    p.add_argument("--micro-batch", type=int, default=0, help="use this micro-batch instead of searching")
    p.add_argument("--max-micro-batch", type=int, default=64)
    p.add_argument("--profile", action="store_true", help="profile each variant: top kernels and their share")
    p.add_argument("--json", default="", help="also write the results here")
    p.add_argument("--tiny", action="store_true", help="a debug-sized model, 2 steps, on whatever device (CPU tests)")
    args = p.parse_args(argv)
    if args.tiny:
        args.seq_len, args.steps, args.warmup = min(args.seq_len, 64), 2, 1
        args.max_micro_batch = min(args.max_micro_batch, 2)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model = TINY if args.tiny else LLAMA_1B
    cfg = job_for(model, args.seq_len, 1, "none", False, "bf16").model
    peak = job_peak(device, "fp32" if args.tiny and device.type == "cpu" else "bf16", 1, 1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; peak for MFU: {peak.label}", flush=True)
    print(f"model: {param_counts(cfg).total / 1e6:,.1f}M parameters, {cfg.n_layers} layers, dim {cfg.dim}, "
          f"vocab {cfg.vocab_size}, seq {args.seq_len}; MFU = model FLOPs (no recompute) / peak", flush=True)
    results, eager_mb = [], {}
    modes = [m.strip() for m in args.compile.split(",") if m.strip()]
    for recompute in [m.strip() for m in args.recompute.split(",") if m.strip()]:
        for mode in modes:
            compiled = mode == "compiled"
            start = eager_mb.get(recompute, 0) if compiled else 0  # 0: search up from 1
            r, runner = run_variant(args, device, recompute, compiled, start or 1, search_up=not start)
            if r is None:
                continue
            results.append(r)
            if not compiled:
                eager_mb[recompute] = r.micro_batch
            if args.profile:
                print(profile(runner, r.micro_batch), flush=True)
            runner.close()  # before the next variant: its peak memory is its own
            torch._dynamo.reset()  # each variant compiles its own graphs
    print(table(results, planner_gpu(device)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
