"""Kernel rates on this GPU, measured for the planner's catalog (shoal/hardware/catalog.py): what the
efficiencies it multiplies peaks by stand on.

    python bench/gpu_kernels.py --json kernels.json     # on a GPU machine, ~75 s on an H200

- GEMMs at the shapes of real layers (Llama 3 8B, 70B and 405B under TP 8, a 1B), bf16 and FP8
  (tensorwise and rowwise scales), each as the forward, data-gradient and weight-gradient product;
- fine-grained MoE experts: one grouped GEMM over the local experts (torch._grouped_mm, what
  Megatron-Core's grouped-GEMM path does), the same experts one GEMM each, and one dense GEMM of the
  same FLOPs;
- attention per SDPA backend (cuDNN, FlashAttention-2; memory-efficient attention refuses GQA inputs
  and reports so), causal, forward and forward+backward, and with a packed-document mask (a dense
  boolean mask, as shoal passes it), and the same mask as a flex_attention block mask;
- the host's cost per eager op (what the device waits for when the host cannot run ahead), an HBM
  copy, pinned host<->device copies and what save_on_cpu (activation offload) adds per saved byte.

Rates follow the planner's FLOP conventions (planner/compute.py): a GEMM is 2mkn; causal attention
forward is half of 4·T·S·H·d and its backward 2.5 times the forward. Every timed loop runs after a
warm-up that brings the clocks to what the power limit sustains, so the numbers are the sustained
ones the catalog wants, not a cold burst.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

TFLOP = 1e12


def timed(fn, min_seconds: float = 0.25) -> float:
    """Seconds per call of fn on the GPU (CUDA events), over enough calls to fill min_seconds."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    per = start.elapsed_time(end) / 3e3
    n = max(3, min(2000, math.ceil(min_seconds / max(per, 1e-7))))
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / n


def warm_up(seconds: float) -> None:
    """Back-to-back bf16 GEMMs until the clocks settle where the power limit holds them."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


# (name, tokens m, in k, out n): the forward product of one linear layer, x[m,k] @ W[n,k]^T.
GEMMS = [
    ("square 8192", 8192, 8192, 8192),
    ("llama3-8b qkv", 8192, 4096, 6144),
    ("llama3-8b out", 8192, 4096, 4096),
    ("llama3-8b w13", 8192, 4096, 28672),
    ("llama3-8b w2", 8192, 14336, 4096),
    ("llama3-70b/tp8 qkv", 8192, 8192, 1280),
    ("llama3-70b/tp8 out", 8192, 1024, 8192),
    ("llama3-70b/tp8 w13", 8192, 8192, 7168),
    ("llama3-70b/tp8 w2", 8192, 3584, 8192),
    ("llama3-405b/tp8 w13", 8192, 16384, 13312),
    ("llama3-405b/tp8 w2", 8192, 6656, 16384),
    ("llama3.2-1b w13", 32768, 2048, 16384),
    ("llama3.2-1b w2", 32768, 8192, 2048),
]


def gemm_products(m: int, k: int, n: int, dtype: torch.dtype):
    """Operands of the three products of a linear layer in the layouts cuBLAS takes without a copy."""
    x = torch.randn(m, k, device="cuda").to(dtype)
    w = torch.randn(n, k, device="cuda").to(dtype)
    dy = torch.randn(m, n, device="cuda").to(dtype)
    return {"fwd": (x, w.t()), "dgrad": (dy, w.t().contiguous().t()), "wgrad": (dy.t().contiguous(), x.t().contiguous().t())}


def bench_gemms(names: set[str] | None = None) -> list[dict]:
    rows = []
    for name, m, k, n in GEMMS:
        if names and name not in names:
            continue
        flops = 2.0 * m * k * n
        row = {"name": name, "m": m, "k": k, "n": n}
        for product, (a, b) in gemm_products(m, k, n, torch.bfloat16).items():
            row[f"bf16_{product}_tflops"] = flops / timed(lambda: a @ b) / TFLOP
        for recipe in ("tensorwise", "rowwise"):
            try:
                for product, (a, b) in gemm_products(m, k, n, torch.float8_e4m3fn).items():
                    sa, sb = _scales(a, b, recipe)
                    row[f"fp8_{recipe}_{product}_tflops"] = flops / timed(
                        lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)) / TFLOP
            except Exception as e:  # noqa: BLE001 - a report, not a test: say what failed and go on
                row[f"fp8_{recipe}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _scales(a: torch.Tensor, b: torch.Tensor, recipe: str):
    if recipe == "tensorwise":
        one = torch.ones((), device="cuda")
        return one, one
    return (torch.ones(a.shape[0], 1, device="cuda"), torch.ones(1, b.shape[1], device="cuda"))


# Fine-grained MoE layers (expert FFN, hidden h, experts E, top-k) on an ep group, 4096 tokens per rank and
# micro-batch, tokens spread evenly: each local expert gets 4096·k·ep/E tokens.
EXPERTS = [
    ("qwen3-30b-a3b ep8", 2048, 768, 128, 8, 8),
    ("qwen3-235b-a22b ep8", 4096, 1536, 128, 8, 8),
    ("gpt-oss-120b ep8", 2880, 2880, 128, 4, 8),
    ("deepseek-v3 ep64", 7168, 2048, 256, 8, 64),
    ("mixtral-8x7b ep8", 4096, 14336, 8, 2, 8),
]


def bench_experts() -> list[dict]:
    rows = []
    grouped = getattr(torch, "_grouped_mm", None)
    for name, h, f, experts, k, ep in EXPERTS:
        local = max(1, experts // ep)
        per = 4096 * k * ep // experts
        row = {"name": name, "local_experts": local, "tokens_per_expert": per}
        for label, kk, nn in (("w13", h, 2 * f), ("w2", f, h)):
            flops = 2.0 * local * per * kk * nn
            x = torch.randn(local * per, kk, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(local, nn, kk, device="cuda", dtype=torch.bfloat16)
            dense = torch.randn(nn, kk, device="cuda", dtype=torch.bfloat16)
            row[f"{label}_dense_tflops"] = flops / timed(lambda: x @ dense.t()) / TFLOP
            xs = x.split(per)
            row[f"{label}_loop_tflops"] = flops / timed(lambda: [xi @ w[i].t() for i, xi in enumerate(xs)]) / TFLOP
            if grouped is not None:
                offs = torch.arange(1, local + 1, device="cuda", dtype=torch.int32) * per
                wt = w.transpose(1, 2)
                try:
                    row[f"{label}_grouped_tflops"] = flops / timed(lambda: grouped(x, wt, offs=offs)) / TFLOP
                except Exception as e:  # noqa: BLE001
                    row[f"{label}_grouped_error"] = f"{type(e).__name__}: {str(e)[:160]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_attention() -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "memory-efficient": SDPBackend.EFFICIENT_ATTENTION}
    # (heads, kv heads, head dim, sequence): Llama 3 8B / 70B-per-TP-8-rank shapes and the 1B's head dim 64
    for heads, kv, dim, seq in ((32, 8, 128, 4096), (32, 8, 128, 8192), (8, 1, 128, 8192), (32, 8, 64, 4096)):
        batch = max(1, 16384 // seq)
        fwd_flops = 0.5 * 4.0 * batch * seq * seq * heads * dim
        q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        kk = torch.randn(batch, kv, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        vv = torch.randn(batch, kv, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
        docs = (torch.arange(seq, device="cuda") // 1024)  # packed documents of 1,024 tokens
        mask = (docs[:, None] == docs[None, :]) & torch.ones(seq, seq, device="cuda", dtype=torch.bool).tril()
        mask = mask[None, None].expand(batch, 1, seq, seq)
        for label, backend in backends.items():
            for masked in (False, True):
                row = {"heads": heads, "kv_heads": kv, "head_dim": dim, "seq": seq, "batch": batch,
                       "backend": label, "mask": "documents of 1024" if masked else "causal"}
                args = {"attn_mask": mask} if masked else {"is_causal": True}
                try:
                    with sdpa_kernel([backend]):
                        fwd = timed(lambda: F.scaled_dot_product_attention(q, kk, vv, enable_gqa=kv != heads, **args))
                        both = timed(lambda: F.scaled_dot_product_attention(
                            q, kk, vv, enable_gqa=kv != heads, **args).backward(grad))
                    row.update(fwd_ms=fwd * 1e3, bwd_ms=(both - fwd) * 1e3, fwd_tflops=fwd_flops / fwd / TFLOP,
                               bwd_tflops=2.5 * fwd_flops / (both - fwd) / TFLOP)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def bench_flex_documents(seq: int = 8192) -> dict:
    """Document masking through flex_attention's block mask (compiled), the kernel that skips the
    blocks a document mask zeroes, against the same shape's causal cuDNN time above."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    heads, kv, dim, batch = 32, 8, 128, 16384 // seq
    docs = torch.arange(seq, device="cuda") // 1024

    def doc_causal(b, h, qi, ki):
        return (docs[qi] == docs[ki]) & (qi >= ki)

    row = {"heads": heads, "kv_heads": kv, "head_dim": dim, "seq": seq, "batch": batch, "backend": "flex (compiled)"}
    flex = torch.compile(flex_attention)
    q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, kv, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, kv, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(q)
    fwd_flops = 0.5 * 4.0 * batch * seq * seq * heads * dim
    for label, mask_mod in (("causal", lambda b, h, qi, ki: qi >= ki), ("documents of 1024", doc_causal)):
        block = create_block_mask(mask_mod, None, None, seq, seq, device="cuda")
        fwd = timed(lambda: flex(q, k, v, block_mask=block, enable_gqa=True))
        both = timed(lambda: flex(q, k, v, block_mask=block, enable_gqa=True).backward(grad))
        row[f"{label} fwd_ms"], row[f"{label} bwd_ms"] = fwd * 1e3, (both - fwd) * 1e3
        row[f"{label} fwd_tflops_causal_equivalent"] = fwd_flops / fwd / TFLOP
    print(json.dumps(row), flush=True)
    return row


def bench_host() -> dict:
    """Host seconds per eager op: tiny kernels the device finishes faster than the host issues them."""
    x = torch.zeros(16, device="cuda")
    lin = torch.nn.Linear(64, 64, device="cuda")
    inp = torch.randn(8, 64, device="cuda")
    out = {}
    for label, op, n in (("add_", lambda: x.add_(1.0), 20000), ("linear module", lambda: lin(inp), 5000),
                         ("item (sync round trip)", lambda: x.sum().item(), 2000)):
        for _ in range(100):
            op()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            op()
        torch.cuda.synchronize()
        out[f"{label} us"] = (time.perf_counter() - t0) / n * 1e6
    big = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(big)
    out["hbm copy TB/s (read+write)"] = 2 * big.numel() / timed(lambda: dst.copy_(big)) / 1e12
    print(json.dumps(out), flush=True)
    return out


def bench_offload() -> dict:
    """Host<->device copies: pinned bandwidth each way, and what torch.autograd.graph.save_on_cpu (shoal's
    train.activation_offload) adds to forward+backward of a stack of MLP blocks per byte it saves: the
    planner charges 2 x saved bytes / host_bandwidth (planner/timing.py)."""
    out = {}
    dev = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    host = torch.empty(2**30, dtype=torch.uint8, pin_memory=True)
    out["pinned d2h GB/s"] = dev.numel() / timed(lambda: host.copy_(dev, non_blocking=True)) / 1e9
    out["pinned h2d GB/s"] = dev.numel() / timed(lambda: dev.copy_(host, non_blocking=True)) / 1e9
    blocks = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU()) for _ in range(8)])
    blocks = blocks.to("cuda", torch.bfloat16)
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    saved = []

    def count(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        blocks(x).sum().backward()
    out["saved GB"] = sum(saved) / 1e9
    plain = timed(lambda: blocks(x).sum().backward(), 1.0)

    def offloaded():
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            loss = blocks(x).sum()
        loss.backward()
    off = timed(offloaded, 1.0)
    out.update({"plain fwd+bwd ms": plain * 1e3, "save_on_cpu fwd+bwd ms": off * 1e3,
                "save_on_cpu effective GB/s (2 x saved / added time)": 2 * sum(saved) / (off - plain) / 1e9})
    print(json.dumps(out), flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--warmup", type=float, default=6.0, help="seconds of GEMMs before measuring")
    parser.add_argument("--parts", default="host,offload,gemm,experts,attention,flex")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    props = torch.cuda.get_device_properties(0)
    report = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda}
    print(json.dumps(report), flush=True)
    warm_up(args.warmup)
    parts = args.parts.split(",")
    for part, fn in (("host", bench_host), ("offload", bench_offload), ("gemm", bench_gemms), ("experts", bench_experts),
                     ("attention", bench_attention), ("flex", bench_flex_documents)):
        if part not in parts:
            continue
        t0 = time.perf_counter()
        try:
            report[part] = fn()
        except Exception as e:  # noqa: BLE001
            report[part] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{part}: {report[part]['error']}", flush=True)
        print(f"== {part} took {time.perf_counter() - t0:.1f}s", flush=True)
        torch.cuda.empty_cache()
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
