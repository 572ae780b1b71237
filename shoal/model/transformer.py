"""A Llama-style decoder, single-device code.

Layers live in a ModuleDict keyed by their index ("0", "1", ...), so a pipeline stage that keeps
only some of them keeps their parameter names too. A stage without the embedding, final norm or
output head has those attributes set to None; forward then takes and returns hidden states.
Tensor names carry their shapes: B batch, T time, D model dim, H heads, K kv heads, E head dim.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from shoal.model.config import ModelConfig
from shoal.model.mlp import FeedForward
from shoal.model.moe import MoE
from shoal.model.precision import upcast


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 for stability under bf16 autocast, as Llama does.
        x32 = upcast(x)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * upcast(self.weight)).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device=None) -> torch.Tensor:
    """cos and sin of the rotary angles, stacked: [2, max_seq_len, head_dim // 2], fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x_BTHE: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head (the Hugging Face Llama layout, so weights load as-is)."""
    T = x_BTHE.shape[1]
    cos, sin = rope[0, :T, None, :], rope[1, :T, None, :]  # [T, 1, E/2]
    x1, x2 = upcast(x_BTHE).chunk(2, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return rotated.type_as(x_BTHE)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x_BTD: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        # -1, not n_heads: under tensor parallelism each rank holds only its share of the heads.
        q_BTHE = self.wq(x_BTD).view(B, T, -1, self.head_dim)
        k_BTKE = self.wk(x_BTD).view(B, T, -1, self.head_dim)
        v_BTKE = self.wv(x_BTD).view(B, T, -1, self.head_dim)
        q_BTHE, k_BTKE = apply_rope(q_BTHE, rope), apply_rope(k_BTKE, rope)
        out_BHTE = F.scaled_dot_product_attention(
            q_BTHE.transpose(1, 2), k_BTKE.transpose(1, 2), v_BTKE.transpose(1, 2),
            is_causal=True, enable_gqa=q_BTHE.shape[2] != k_BTKE.shape[2],
        )
        return self.wo(out_BHTE.transpose(1, 2).reshape(B, T, -1))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.is_moe = cfg.is_moe_layer(layer)
        self.feed_forward = MoE(cfg) if self.is_moe else FeedForward(cfg.dim, cfg.ffn_hidden, cfg.mlp)

    def forward(self, x_BTD: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h_BTD = x_BTD + self.attention(self.attention_norm(x_BTD), rope)
        return h_BTD + self.feed_forward(self.ffn_norm(h_BTD))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Not persistent: derived from the config, and rebuilt by init_weights after meta-device construction.
        self.register_buffer("rope", rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta), persistent=False)

    def forward(self, tokens_or_h: torch.Tensor) -> torch.Tensor:
        """Token ids [B, T] -> logits [B, T, V]; on a pipeline stage, hidden states in or out."""
        h_BTD = self.tok_embeddings(tokens_or_h) if self.tok_embeddings is not None else tokens_or_h
        for layer in self.layers.values():
            h_BTD = layer(h_BTD, self.rope)
        if self.norm is not None:
            h_BTD = self.norm(h_BTD)
        return self.output(h_BTD) if self.output is not None else h_BTD

    @torch.no_grad()
    def init_weights(self, seed: int | None = None, assign=torch.Tensor.copy_) -> None:
        """Initialize every parameter in place (also after building on the meta device + to_empty).

        Normal(0, 0.02) everywhere; the projections that write into the residual stream (wo, w2)
        are scaled by 1/sqrt(2 * n_layers) so the residual variance does not grow with depth.
        Each parameter draws from its own generator, seeded by `seed` and its name: a pipeline
        stage or a sharded parameter gets exactly the values the whole model would. `assign(p, value)`
        puts a full value into a parameter (parallel/parallelize.py passes one that takes a DTensor's slice).
        """
        self.rope = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta, device=self.rope.device)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            name = param_name(name)
            if name.endswith("norm.weight"):
                value = torch.ones(p.shape)
            else:
                std = residual_std if name.endswith(("wo.weight", "w2.weight", "w2")) else 0.02
                value = torch.empty(p.shape).normal_(0.0, std, generator=_generator(seed, name))
            assign(p, value)


WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")


def param_name(name: str) -> str:
    """A parameter's name in the plain model, without the parts activation checkpointing and
    torch.compile insert."""
    for part in WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _generator(seed: int | None, name: str) -> torch.Generator | None:
    if seed is None:
        return None  # the global generator: values do not matter (a checkpoint overwrites them)
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu", seed: int | None = 0) -> Transformer:
    """Build and initialize a model; on the meta device nothing is allocated or initialized."""
    with torch.device(device):
        model = Transformer(cfg)
    if str(device) != "meta":
        model.init_weights(seed)
    return model


def cross_entropy(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in nats, computed in fp32 (or float64, see precision.py)."""
    return F.cross_entropy(upcast(logits_BTV.flatten(0, 1)), targets_BT.flatten(0, 1))
