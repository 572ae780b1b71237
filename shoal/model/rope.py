"""Rotary position embeddings: the frequencies (plain, or rescaled for a longer context) and their use.

Frequencies are theta^(-2i/E) for i < E/2 (E the head width). Models trained for a longer context
than they were pre-trained at rescale them (`model.rope_scaling`), each as its paper defines it:
- `linear` (position interpolation, Chen et al. 2023): every frequency divided by the factor.
- `llama3` (Llama 3.1): wavelengths longer than original_len / low_freq_factor are divided by the
  factor, those shorter than original_len / high_freq_factor are kept, and those between are
  interpolated linearly in original_len / wavelength.
- `yarn` (Peng et al. 2023): each frequency interpolated between kept and divided by the factor by a
  ramp over the dimensions that turn between beta_slow and beta_fast times within original_len, and
  cos/sin scaled by an attention factor (0.1 ln(factor) + 1 unless given).
The rotation itself uses the Hugging Face layout (the two halves of a head, not interleaved pairs),
so q/k weights load from Hugging Face checkpoints unchanged.
"""

from __future__ import annotations

import math

import torch

from shoal.model.config import ModelConfig
from shoal.model.precision import upcast


def inv_frequencies(cfg: ModelConfig, device=None) -> tuple[torch.Tensor, float]:
    """(the E/2 rotary frequencies, the factor cos and sin are multiplied by), fp32."""
    E, theta = cfg.head_size, cfg.rope_theta
    inv_freq = 1.0 / theta ** (torch.arange(0, E, 2, device=device, dtype=torch.float32) / E)
    kind, factor = cfg.rope_scaling, cfg.rope_factor
    if kind == "none":
        return inv_freq, 1.0
    if kind == "linear":
        return inv_freq / factor, 1.0
    original = cfg.rope_original_max_len
    if kind == "llama3":
        wavelength = 2 * math.pi / inv_freq
        long, short = original / cfg.rope_low_freq_factor, original / cfg.rope_high_freq_factor
        between = (original / wavelength - cfg.rope_low_freq_factor) / (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor)
        scaled = torch.where(wavelength > long, inv_freq / factor, inv_freq)
        smoothed = (1 - between) * scaled / factor + between * scaled
        return torch.where((wavelength >= short) & (wavelength <= long), smoothed, scaled), 1.0
    assert kind == "yarn", kind  # ModelConfig.validate names the rest

    def dims_turning(turns: float) -> float:  # the dimension whose wavelength fits `turns` times into `original`
        return E * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(dims_turning(cfg.rope_beta_fast)), 0)
    high = min(math.ceil(dims_turning(cfg.rope_beta_slow)), E - 1)
    ramp = ((torch.arange(E // 2, device=device, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
    inv_freq = inv_freq / factor * ramp + inv_freq * (1 - ramp)
    attention = cfg.rope_attention_factor or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
    return inv_freq, attention


def rope_tables(cfg: ModelConfig, device=None) -> torch.Tensor:
    """cos and sin of the rotary angles, stacked: [2, max_seq_len, head_size // 2], fp32."""
    inv_freq, scale = inv_frequencies(cfg, device)
    angles = torch.outer(torch.arange(cfg.max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()]) * scale


def apply_rope(x_BTHE: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (the Hugging Face Llama layout, so weights load as-is).
    `rope`: the table [2, max_seq_len, E/2] (positions 0..T-1), or one row per position [2, B, T, E/2]."""
    T = x_BTHE.shape[1]
    if rope.dim() == 4:  # positions that restart per document
        cos, sin = rope[0, :, :, None, :], rope[1, :, :, None, :]  # [B, T, 1, E/2]
    else:
        cos, sin = rope[0, :T, None, :], rope[1, :T, None, :]  # [T, 1, E/2]
    x1, x2 = upcast(x_BTHE).chunk(2, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return rotated.type_as(x_BTHE)
