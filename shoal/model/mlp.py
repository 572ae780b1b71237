"""The feed-forward block of a dense transformer layer, and the shared experts of an MoE one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x)) or a GELU MLP (w2(gelu(w1 x)))."""

    def __init__(self, dim: int, hidden: int, kind: str = "swiglu"):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False) if kind == "swiglu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x), approximate="tanh"))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
