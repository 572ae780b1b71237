"""Which attention kernel runs, chosen by device: the scaled_dot_product_attention backends a run
allows, in the order it prefers them, and a probe that names the one PyTorch picks.

The model calls F.scaled_dot_product_attention and stays device-free; the training step enters
`attention_kernels(device)` around it (parallel_model.py), and the run summary names the backend
(`attention_backend`). PyTorch's dispatcher takes the first allowed backend that supports the
inputs (dtype, head dim, GQA, causal mask), so the name comes from asking it with the run's shapes.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# Hopper and newer: cuDNN's fused attention (FlashAttention-3-like) is faster than the FlashAttention-2
# kernel PyTorch ships; older GPUs: FlashAttention-2 first. Memory-efficient attention covers what
# neither supports; math (unfused, T x T scores in memory) is the last resort.
CUDA_SM90 = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
CUDA_OLDER = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
# CPU: a flash-style fused kernel (no T x T buffer) for fp32 and bf16, or math.
CPU = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]

_NAMES = {SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.FLASH_ATTENTION: "flash",
          SDPBackend.EFFICIENT_ATTENTION: "memory-efficient", SDPBackend.MATH: "math (unfused)"}


def attention_backends(device_type: str, capability: tuple[int, int] | None = None) -> list[SDPBackend]:
    """The allowed SDPA backends in priority order. capability: the CUDA compute capability."""
    if device_type == "cuda":
        return CUDA_SM90 if capability is not None and capability >= (9, 0) else CUDA_OLDER
    return CPU


def attention_kernels(device: torch.device):
    """Context manager that allows (and orders) this device's attention backends."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return sdpa_kernel(attention_backends(device.type, capability), set_priority=True)


def attention_backend(n_heads: int, n_kv_heads: int, head_dim: int, seq_len: int, device: torch.device,
                      dtype: torch.dtype) -> str:
    """The backend SDPA dispatches this model's causal attention to on `device` in `dtype`, e.g.
    'flash (cuda)', 'flash (cpu kernel)'. Asks the dispatcher with one sequence of the run's shape."""
    q = torch.zeros(1, n_heads, seq_len, head_dim, device=device, dtype=dtype)
    kv = torch.zeros(1, n_kv_heads, seq_len, head_dim, device=device, dtype=dtype)
    with attention_kernels(device):
        choice = SDPBackend(torch._fused_sdp_choice(q, kv, kv, is_causal=True, enable_gqa=n_heads != n_kv_heads))
    where = "cpu kernel" if device.type == "cpu" else device.type
    return f"{_NAMES.get(choice, choice.name.lower())} ({where})"
