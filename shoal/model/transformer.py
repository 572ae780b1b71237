"""A Llama-style decoder, single-device code.

Layers live in a ModuleDict keyed by their index ("0", "1", ...), so a pipeline stage that keeps
only some of them keeps their parameter names too. A stage without the embedding, final norm or
output head has those attributes set to None; forward then takes and returns hidden states.
Tensor names carry their shapes: B batch, T time, D model dim, H heads, K kv heads, E head size.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from shoal.errors import UserError
from shoal.model.config import ModelConfig
from shoal.model.mlp import FeedForward
from shoal.model.moe import MoE
from shoal.model.precision import upcast
from shoal.model.rope import apply_rope, rope_tables


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


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E = self.head_size = cfg.head_size
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * E, bias=cfg.qkv_bias)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * E, bias=cfg.qkv_bias)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * E, bias=cfg.qkv_bias)
        self.wo = nn.Linear(cfg.n_heads * E, cfg.dim, bias=False)
        self.q_norm = RMSNorm(E, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(E, cfg.norm_eps) if cfg.qk_norm else None
        self.window = cfg.sliding_window

    def forward(self, x_BTD: torch.Tensor, rope: torch.Tensor, mask_B1TT: torch.Tensor | None = None) -> torch.Tensor:
        """`mask_B1TT`: which keys each query may see, when documents are masked (document_attention);
        None: causal, with the sliding window if the model has one."""
        B, T, _ = x_BTD.shape
        # -1, not n_heads: under tensor parallelism each rank holds only its share of the heads.
        q_BTHE = self.wq(x_BTD).view(B, T, -1, self.head_size)
        k_BTKE = self.wk(x_BTD).view(B, T, -1, self.head_size)
        v_BTKE = self.wv(x_BTD).view(B, T, -1, self.head_size)
        if self.q_norm is not None:
            q_BTHE, k_BTKE = self.q_norm(q_BTHE), self.k_norm(k_BTKE)
        q_BTHE, k_BTKE = apply_rope(q_BTHE, rope), apply_rope(k_BTKE, rope)
        out_BHTE = self.attend(q_BTHE.transpose(1, 2), k_BTKE.transpose(1, 2), v_BTKE.transpose(1, 2), mask_B1TT)
        return self.wo(out_BHTE.transpose(1, 2).reshape(B, T, -1))

    def attend(self, q_BHTE: torch.Tensor, k_BKTE: torch.Tensor, v_BKTE: torch.Tensor,
               mask_B1TT: torch.Tensor | None) -> torch.Tensor:
        """Scaled dot-product attention over the sequence (GQA: each kv head serves H/K query heads).
        Context parallelism replaces it on each layer with attention over the keys and values of
        every rank's part of the sequence (shoal/parallel/context_parallel.py)."""
        return F.scaled_dot_product_attention(
            q_BHTE, k_BKTE, v_BKTE,
            **(causal(q_BHTE.shape[2], self.window, q_BHTE.device) if mask_B1TT is None else {"attn_mask": mask_B1TT}),
            enable_gqa=q_BHTE.shape[1] != k_BKTE.shape[1],
        )


def causal(T: int, window: int, device) -> dict:
    """SDPA's mask arguments: causal, and with a sliding window shorter than the sequence a band of
    `window` tokens (each query sees itself and the window - 1 before it)."""
    if not window or window >= T:
        return {"is_causal": True}
    i = torch.arange(T, device=device)
    offset_TT = i[:, None] - i[None, :]
    return {"attn_mask": (offset_TT >= 0) & (offset_TT < window)}


def document_attention(documents_BT: torch.Tensor, rope: torch.Tensor, window: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """For packed sequences: (rotary table per position, attention mask) that keep each document to
    itself. `documents_BT` numbers the document of each position (the loader's third tensor);
    positions restart at 0 where a document starts, and a query sees the keys of its own document
    at or before it (within the sliding window, if any). The result is what each document would give
    run alone (tests/unit/test_model.py checks it)."""
    i = torch.arange(documents_BT.shape[1], device=documents_BT.device)
    offset_TT = i[:, None] - i[None, :]
    allowed_TT = (offset_TT >= 0) & (offset_TT < window) if window else offset_TT >= 0
    mask_B1TT = (documents_BT[:, None, :, None] == documents_BT[:, None, None, :]) & allowed_TT
    return rope[:, document_positions(documents_BT)], mask_B1TT


def document_positions(documents_BT: torch.Tensor) -> torch.Tensor:
    """Each position's offset from the start of its document [B, T] (0 where a document starts)."""
    i = torch.arange(documents_BT.shape[1], device=documents_BT.device)
    starts = torch.ones_like(documents_BT, dtype=torch.bool)
    starts[:, 1:] = documents_BT[:, 1:] != documents_BT[:, :-1]
    return i - torch.where(starts, i, 0).cummax(dim=1).values


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.is_moe = cfg.is_moe_layer(layer)
        self.feed_forward = MoE(cfg) if self.is_moe else FeedForward(cfg.dim, cfg.ffn_hidden, cfg.mlp)

    def forward(self, x_BTD: torch.Tensor, rope: torch.Tensor, mask_B1TT: torch.Tensor | None = None) -> torch.Tensor:
        h_BTD = x_BTD + self.attention(self.attention_norm(x_BTD), rope, mask_B1TT)
        return h_BTD + self.feed_forward(self.ffn_norm(h_BTD))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg, i) for i in range(cfg.n_layers)})
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.tie_weights()
        # Not persistent: derived from the config, and rebuilt by init_weights after meta-device construction.
        self.register_buffer("rope", rope_tables(cfg), persistent=False)

    def forward(self, tokens_or_h: torch.Tensor, documents_BT: torch.Tensor | None = None):
        """Token ids [B, T] -> logits [B, T, V]; on a pipeline stage, hidden states in or out.

        documents_BT: the document of each position of packed sequences (data.document_mask); a
        pipeline stage without the output head then passes it on beside its hidden states, since the
        next stage needs it too."""
        h_BTD = self.tok_embeddings(tokens_or_h) if self.tok_embeddings is not None else tokens_or_h
        rope, mask_B1TT = self.attention_inputs(documents_BT)
        for layer in self.layers.values():
            h_BTD = layer(h_BTD, rope, mask_B1TT)
        if self.norm is not None:
            h_BTD = self.norm(h_BTD)
        if self.output is not None:
            return self.output(h_BTD)
        return h_BTD if documents_BT is None else (h_BTD, documents_BT)

    def attention_inputs(self, documents_BT: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What every layer takes beside its input: the rotary table (or one row per position) and the
        mask (None: causal). Context parallelism replaces it on each stage, whose tokens are chunks of
        a longer sequence (shoal/parallel/context_parallel.py)."""
        if documents_BT is None:
            return self.rope, None
        return document_attention(documents_BT, self.rope, self.cfg.sliding_window)

    def tie_weights(self) -> None:
        """With tied embeddings the head uses the embedding's parameter. Called again after anything
        that gives each module its own new parameter: to_empty (materializing a meta-device model) and
        tensor parallelism's styles both replace them one module at a time."""
        if self.cfg.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def init_rope(self) -> None:
        """The rotary table, a buffer derived from the config (after building on the meta device + to_empty)."""
        self.rope = rope_tables(self.cfg, device=self.rope.device)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None, assign=torch.Tensor.copy_) -> None:
        """Initialize every parameter in place (also after building on the meta device + to_empty).

        Normal(0, 0.02) everywhere, norms at one and biases at zero; the projections that write into
        the residual stream (wo, w2) are scaled by 1/sqrt(2 * n_layers) so the residual variance does
        not grow with depth.
        Each parameter draws from its own generator, seeded by `seed` and its name: a pipeline
        stage or a sharded parameter gets exactly the values the whole model would. `assign(p, value)`
        puts a full value into a parameter (parallel/parallelize.py passes one that takes a DTensor's slice).
        """
        self.init_rope()
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            name = param_name(name)
            if name.endswith("norm.weight"):
                value = torch.ones(p.shape)
            elif name.endswith(".bias"):
                value = torch.zeros(p.shape)
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
    if cfg.is_mla:  # planned only (model/analytics.py): never build plain attention in its place
        raise UserError("model.kv_lora_rank", cfg.kv_lora_rank, "shoal's transformer has no multi-head latent "
                        "attention; set kv_lora_rank, q_lora_rank, qk_rope_head_dim and v_head_dim to 0")
    with torch.device(device):
        model = Transformer(cfg)
    if str(device) != "meta":
        model.init_weights(seed)
    return model


IGNORE = -100
"""A target the loss skips (F.cross_entropy's ignore_index): fine-tuning prompts (shoal/data/loader.py)."""


def cross_entropy(logits_BTV: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss in nats over the targets that count, computed in fp32 (or float64, see
    precision.py). A micro-batch with none (a window inside a long prompt) adds 0 and no gradient,
    where the mean over nothing would be NaN and stop the run."""
    targets = targets_BT.flatten(0, 1)
    if not (targets != IGNORE).any():
        return logits_BTV.sum() * 0.0
    return F.cross_entropy(upcast(logits_BTV.flatten(0, 1)), targets, ignore_index=IGNORE)
