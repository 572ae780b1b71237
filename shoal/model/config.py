"""ModelConfig and the named presets.

Small presets (`debug`, `tiny`, `tiny-moe`) are for tests and demos; the rest describe real
architectures for planning and are only ever built on the meta device.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field

from shoal.errors import UserError


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder, optionally with mixture-of-experts feed-forward layers."""

    vocab_size: int = 256
    """Token ids the embedding and output head cover (256 for the byte tokenizer)."""
    dim: int = 64
    """Model (residual stream) width."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Query heads."""
    n_kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide n_heads."""
    head_dim: int = 0
    """Width of one attention head; 0: dim / n_heads (Qwen3 and others set their own). With MLA, the query/key
    head: its position-free part plus qk_rope_head_dim (DeepSeek-V2/V3: 128 + 64 = 192)."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (MLA, DeepSeek-V2 paper §2.1): keys and values come up from one latent of
    this width per token (DeepSeek-V2/V3: 512); 0: plain attention. Planned only: shoal train refuses it."""
    q_lora_rank: int = 0
    """MLA: queries come up from a latent of this width (DeepSeek-V2/V3: 1536); 0: one full-width projection."""
    qk_rope_head_dim: int = 0
    """MLA: the part of each query/key head that carries the rotary embedding, its key part shared by all
    heads (DeepSeek-V2/V3: 64)."""
    v_head_dim: int = 0
    """MLA: width of one value head, and of each head's share of the output projection; 0: head_dim
    (DeepSeek-V2/V3: 128)."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2, Qwen2.5)."""
    qk_norm: bool = False
    """An RMSNorm over each query and key head before the rotary embedding (Qwen3)."""
    sliding_window: int = 0
    """Each token attends to at most this many tokens, itself included (Mistral 7B v0.1: 4096); 0: all before it."""
    ffn_hidden: int = 192
    """Hidden size of a dense feed-forward layer (per gate for SwiGLU)."""
    mlp: str = "swiglu"
    """`swiglu` (Llama) or `gelu` (GPT-style two-matrix MLP)."""
    max_seq_len: int = 256
    """Longest sequence the rotary tables cover; train.seq_len may not exceed it."""
    rope_theta: float = 10000.0
    """Rotary embedding base."""
    rope_scaling: str = "none"
    """Rotary frequencies rescaled for a longer context: none, linear, llama3 (Llama 3.1+) or yarn (shoal/model/rope.py)."""
    rope_factor: float = 1.0
    """How many times longer the context is than rope_original_max_len (linear, llama3, yarn)."""
    rope_original_max_len: int = 0
    """The context the model was pre-trained at, before rescaling (llama3, yarn)."""
    rope_low_freq_factor: float = 1.0
    """llama3: wavelengths longer than rope_original_max_len / this are divided by rope_factor."""
    rope_high_freq_factor: float = 4.0
    """llama3: wavelengths shorter than rope_original_max_len / this are kept."""
    rope_beta_fast: float = 32.0
    """yarn: dimensions turning more often than this within the original context are kept."""
    rope_beta_slow: float = 1.0
    """yarn: dimensions turning less often than this are divided by rope_factor."""
    rope_attention_factor: float = 0.0
    """yarn: what cos and sin are multiplied by; 0: 0.1 ln(rope_factor) + 1."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Share the input embedding and the output head weights."""
    # Mixture of experts; n_experts == 0 means a dense model.
    n_experts: int = 0
    """Routed experts per MoE layer; 0 makes a dense model."""
    top_k: int = 2
    """Experts each token is routed to."""
    router_renormalize: bool = True
    """Scale each token's top_k router weights to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob)."""
    expert_ffn_hidden: int = 0
    """Hidden size of one routed expert (0: same as ffn_hidden)."""
    n_shared_experts: int = 0
    """Experts every token goes through, in addition to its top_k routed ones (DeepSeek style)."""
    expert_groups: int = 0
    """Group-limited routing (DeepSeek-V2 §2.1.2 device-limited, V3 §2.1.2 node-limited: config.json's n_group):
    the routed experts split into this many groups, in order, and a token picks its top_k among the experts of
    expert_groups_per_token of them. Laid out a group to a node, it bounds the nodes a token's dispatch reaches
    (V3: at most 4 of 8); 0: no limit. Planned only: shoal train routes over every expert and refuses it."""
    expert_groups_per_token: int = 0
    """Group-limited routing: the groups a token's experts come from (config.json's topk_group; V3 4, V2 3)."""
    moe_every: int = 1
    """Every moe_every-th layer (after the leading dense ones) is an MoE layer."""
    n_dense_layers: int = 0
    """Leading layers that stay dense in an MoE model (DeepSeek-V3 keeps 3)."""
    aux_loss_coef: float = 0.01
    """Weight of the Switch-style load-balancing loss added to the training loss."""
    note: str = field(default="", compare=False)
    """What a preset approximates, shown by `shoal presets`."""

    @property
    def head_size(self) -> int:
        """The width of one attention head: head_dim, or dim / n_heads when it is 0."""
        return self.head_dim or self.dim // self.n_heads

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (kv_lora_rank > 0)."""
        return self.kv_lora_rank > 0

    @property
    def v_head_size(self) -> int:
        """The width of one value head: v_head_dim, or head_size when it is 0."""
        return self.v_head_dim or self.head_size

    @property
    def expert_hidden(self) -> int:
        return self.expert_ffn_hidden or self.ffn_hidden

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        return (
            self.is_moe
            and layer >= self.n_dense_layers
            and (layer - self.n_dense_layers) % self.moe_every == 0
        )

    @property
    def n_moe_layers(self) -> int:
        """How many layers is_moe_layer picks: every moe_every-th after the first n_dense_layers."""
        return max(0, -(-(self.n_layers - self.n_dense_layers) // self.moe_every)) if self.is_moe else 0

    @property
    def max_new_tokens(self) -> int:
        """The most tokens one sampling call makes (`shoal generate --tokens`, train.sample_tokens).

        Sampling re-runs the last max_seq_len tokens for each new one (no KV cache), so a longer
        request would take minutes on CPU with nothing to show for most of it."""
        return self.max_seq_len

    def validate(self, prefix: str = "model", base: "ModelConfig | None" = None) -> "ModelConfig":
        """Every field in range (and finite), then the shapes that must divide. `base`: the preset
        this config was overridden from; a dense model may not change its MoE-only fields from it."""
        def check(ok: bool, name: str, fix: str) -> None:
            if not ok:
                raise UserError(f"{prefix}.{name}", getattr(self, name), fix)

        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "max_seq_len"):
            check(_int(getattr(self, name)) and getattr(self, name) > 0, name, "must be a positive integer")
        for name in ("n_experts", "expert_ffn_hidden", "n_shared_experts", "n_dense_layers", "head_dim", "sliding_window",
                     "rope_original_max_len", "expert_groups", "expert_groups_per_token", *MLA_FIELDS):
            check(_int(getattr(self, name)) and getattr(self, name) >= 0, name, "must be an integer >= 0")
        for name in ("top_k", "moe_every"):
            check(_int(getattr(self, name)) and getattr(self, name) >= 1, name, "must be a positive integer")
        for name, most in SIZE_LIMITS.items():
            check(getattr(self, name) <= most, name, f"must be at most {most:,} (a typo?)")
        # Frequencies are theta^(-k/d): below 1 they grow past one turn per token (and overflow near 0).
        check(_finite(self.rope_theta) and self.rope_theta >= 1, "rope_theta", "must be a finite number >= 1, e.g. 10000")
        # RMSNorm divides by sqrt(mean(x^2) + eps): eps 0 divides by zero on a zero vector, a large one flattens.
        check(_finite(self.norm_eps) and 0 < self.norm_eps < 1, "norm_eps", "must be in (0, 1), e.g. 1e-5")
        check(_finite(self.aux_loss_coef) and self.aux_loss_coef >= 0, "aux_loss_coef",
              "must be a finite number >= 0, e.g. 0.01 (0 disables the load-balancing loss)")
        for name in ("tie_embeddings", "qkv_bias", "qk_norm", "router_renormalize"):
            check(isinstance(getattr(self, name), bool), name, "must be true or false")
        self._check_rope(check)
        self._check_mla(check, prefix)
        if not self.head_dim and self.dim % self.n_heads:
            raise UserError(f"{prefix}.n_heads", self.n_heads,
                            f"dim={self.dim} must be divisible by n_heads (or set {prefix}.head_dim); "
                            f"try {_divisors_near(self.dim, self.n_heads)}")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"{prefix}.n_kv_heads", self.n_kv_heads,
                            f"n_heads={self.n_heads} must be divisible by n_kv_heads; "
                            f"try one of {_divisors(self.n_heads)}")
        if self.head_size % 2:
            field = "head_dim" if self.head_dim else "n_heads"
            raise UserError(f"{prefix}.{field}", getattr(self, field),
                            f"the head width ({self.head_size}) must be even for rotary embeddings")
        if self.mlp not in ("swiglu", "gelu"):
            raise UserError(f"{prefix}.mlp", self.mlp, "use 'swiglu' or 'gelu'")
        if self.is_moe:
            if not 1 <= self.top_k <= self.n_experts:
                raise UserError(f"{prefix}.top_k", self.top_k, f"must be between 1 and n_experts={self.n_experts}")
            check(self.expert_groups or not self.expert_groups_per_token, "expert_groups_per_token",
                  f"limits a token to some of {prefix}.expert_groups, which is 0; set both, or leave it out")
            if self.expert_groups:
                check(self.n_experts % self.expert_groups == 0, "expert_groups",
                      f"must divide n_experts={self.n_experts} (groups of equal size), e.g. 8; 0 for no groups")
                per_group = self.n_experts // max(1, self.expert_groups)
                check(self.top_k <= self.expert_groups_per_token * per_group <= self.n_experts,
                      "expert_groups_per_token", f"must be from {-(-self.top_k // per_group)} (top_k={self.top_k} "
                      f"experts in groups of {per_group}) to expert_groups={self.expert_groups}")
            if self.n_moe_layers == 0:
                raise UserError(f"{prefix}.n_dense_layers", self.n_dense_layers,
                                f"leaves no MoE layer among n_layers={self.n_layers}; lower it")
        elif base is not None:  # a dense model has no router or experts: a value set for them is a mistake
            for name in MOE_ONLY:
                check(getattr(self, name) == getattr(base, name), name,
                      f"applies only to mixture-of-experts models and {prefix}.n_experts=0 here; "
                      f"set {prefix}.n_experts > 0 too, or leave it out")
        return self

    def _check_mla(self, check, prefix: str) -> None:
        """MLA's widths (DeepSeek-V2 paper §2.1): a rotary part inside the query/key head, one latent per
        token for keys and values, so one key/value head per query head after the up-projection."""
        if not self.is_mla:
            for name in MLA_FIELDS[1:]:
                check(getattr(self, name) == 0, name, f"applies only to multi-head latent attention; set "
                      f"{prefix}.kv_lora_rank > 0 too, or leave it out")
            return
        check(self.qk_rope_head_dim % 2 == 0 and 0 < self.qk_rope_head_dim < self.head_size, "qk_rope_head_dim",
              f"must be even, > 0 and below the query/key head width ({self.head_size}; set {prefix}.head_dim)")
        check(self.n_kv_heads == self.n_heads, "n_kv_heads",
              f"must equal n_heads={self.n_heads} with MLA (each head's key and value come up from the latent)")
        for name in ("qkv_bias", "qk_norm", "sliding_window"):
            check(not getattr(self, name), name, "is not combined with multi-head latent attention; leave it out")

    def _check_rope(self, check) -> None:
        """rope_scaling and the numbers it reads (shoal/model/rope.py)."""
        check(self.rope_scaling in ROPE_SCALINGS, "rope_scaling", f"use one of {', '.join(ROPE_SCALINGS)}")
        for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_beta_fast", "rope_beta_slow",
                     "rope_attention_factor"):
            check(_finite(getattr(self, name)) and getattr(self, name) >= 0, name, "must be a finite number >= 0")
        if self.rope_scaling == "none":
            return
        check(self.rope_factor >= 1, "rope_factor", f"must be >= 1 with rope_scaling={self.rope_scaling} (how many "
                                                    "times longer the context is), e.g. 8")
        if self.rope_scaling in ("llama3", "yarn"):
            check(self.rope_original_max_len > 0, "rope_original_max_len",
                  f"give the pre-training context with rope_scaling={self.rope_scaling}, e.g. 8192")
        if self.rope_scaling == "llama3":
            check(0 < self.rope_low_freq_factor < self.rope_high_freq_factor, "rope_low_freq_factor",
                  f"must be > 0 and below rope_high_freq_factor={self.rope_high_freq_factor}, e.g. 1")
        if self.rope_scaling == "yarn":
            check(0 < self.rope_beta_slow < self.rope_beta_fast, "rope_beta_slow",
                  f"must be > 0 and below rope_beta_fast={self.rope_beta_fast}, e.g. 1")

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


ROPE_SCALINGS = ("none", "linear", "llama3", "yarn")

MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")
"""The fields of multi-head latent attention; kv_lora_rank > 0 turns it on."""


MOE_ONLY = ("top_k", "expert_ffn_hidden", "n_shared_experts", "moe_every", "n_dense_layers", "aux_loss_coef",
            "router_renormalize", "expert_groups", "expert_groups_per_token")
"""The fields only an MoE model (n_experts > 0) reads."""


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


SIZE_LIMITS = {"vocab_size": 2**24, "dim": 2**20, "n_layers": 2**16, "n_heads": 2**16, "n_kv_heads": 2**16,
               "head_dim": 2**16, "kv_lora_rank": 2**20, "q_lora_rank": 2**20, "qk_rope_head_dim": 2**16,
               "v_head_dim": 2**16, "sliding_window": 2**24, "rope_original_max_len": 2**24,
               "ffn_hidden": 2**22, "max_seq_len": 2**24, "n_experts": 2**16, "expert_ffn_hidden": 2**22,
               "n_shared_experts": 2**16, "n_dense_layers": 2**16, "top_k": 2**16, "moe_every": 2**16}
"""Ten times and more past the largest published models (Llama 3 405B: dim 16,384, 126 layers, a
128k vocabulary; DeepSeek-V3: 256 experts); a larger value is a typo, and the checks and the
planner's search take time in proportion to some of these."""


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _divisors_near(n: int, k: int) -> list[int]:
    return sorted(_divisors(n), key=lambda d: abs(d - k))[:3]


_LLAMA3 = dict(vocab_size=128256, rope_theta=500000.0, max_seq_len=8192, n_kv_heads=8)
_DEEPSEEK_MLA = dict(n_heads=128, n_kv_heads=128, head_dim=192, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                     v_head_dim=128, max_seq_len=4096)
"""DeepSeek-V2 and V3's multi-head latent attention, from their released config.json files (head_dim is
qk_nope_head_dim 128 + qk_rope_head_dim 64) and DeepSeek-V2 paper §2.1; pre-trained at 4K."""

PRESETS: dict[str, ModelConfig] = {
    "debug": ModelConfig(
        vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=160, max_seq_len=256,
        note="for tests: under 1M parameters"),
    "debug-moe": ModelConfig(
        vocab_size=256, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=160, max_seq_len=256,
        n_experts=4, top_k=2, expert_ffn_hidden=64, n_shared_experts=1, moe_every=2,
        note="for tests: MoE every other layer, 4 experts top-2 + 1 shared"),
    "tiny": ModelConfig(
        vocab_size=256, dim=256, n_layers=6, n_heads=8, n_kv_heads=4, ffn_hidden=688, max_seq_len=512,
        note="for the CPU demo: byte-level"),
    "tiny-moe": ModelConfig(
        vocab_size=256, dim=256, n_layers=6, n_heads=8, n_kv_heads=4, ffn_hidden=688, max_seq_len=512,
        n_experts=8, top_k=2, expert_ffn_hidden=256, n_shared_experts=1,
        note="byte-level MoE: 8 experts top-2 + 1 shared expert in every layer"),
    "llama3-8b": ModelConfig(dim=4096, n_layers=32, n_heads=32, ffn_hidden=14336, **_LLAMA3),
    "llama3-70b": ModelConfig(dim=8192, n_layers=80, n_heads=64, ffn_hidden=28672, **_LLAMA3),
    "llama3-405b": ModelConfig(dim=16384, n_layers=126, n_heads=128, ffn_hidden=53248, **_LLAMA3),
    "mixtral-8x7b": ModelConfig(
        vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
        max_seq_len=32768, rope_theta=1e6, n_experts=8, top_k=2),
    "deepseek-v3": ModelConfig(
        vocab_size=129280, dim=7168, n_layers=61, ffn_hidden=18432, n_experts=256, top_k=8, expert_ffn_hidden=2048,
        n_shared_experts=1, n_dense_layers=3, expert_groups=8, expert_groups_per_token=4, **_DEEPSEEK_MLA,
        note="approximate: sigmoid/aux-free routing as softmax top-k, multi-token-prediction module left out; "
             "multi-head latent attention is planned, not trained"),
    "deepseek-v2": ModelConfig(
        vocab_size=102400, dim=5120, n_layers=60, ffn_hidden=12288, n_experts=160, top_k=6, expert_ffn_hidden=1536,
        n_shared_experts=2, n_dense_layers=1, expert_groups=8, expert_groups_per_token=3, **_DEEPSEEK_MLA,
        note="approximate: device-limited routing as softmax top-k within its groups; multi-head latent attention "
             "is planned, not trained"),
    # From the models' released config.json files (Meta's Llama 2, Mistral AI's v0.3, Alibaba's Qwen2.5 and Qwen3,
    # OpenAI's gpt-oss): the widths, heads, experts, vocabularies, rope bases and context lengths as published.
    "llama2-7b": ModelConfig(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden=11008,
                             max_seq_len=4096),
    "llama2-13b": ModelConfig(vocab_size=32000, dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_hidden=13824,
                              max_seq_len=4096),
    "llama2-70b": ModelConfig(vocab_size=32000, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=28672,
                              max_seq_len=4096),
    "mistral-7b": ModelConfig(vocab_size=32768, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336,
                              max_seq_len=32768, rope_theta=1e6),
    "qwen2.5-7b": ModelConfig(vocab_size=152064, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, ffn_hidden=18944,
                              qkv_bias=True, max_seq_len=32768, rope_theta=1e6),
    "qwen2.5-72b": ModelConfig(vocab_size=152064, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_hidden=29568,
                               qkv_bias=True, max_seq_len=32768, rope_theta=1e6),
    "qwen3-8b": ModelConfig(vocab_size=151936, dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
                            ffn_hidden=12288, qk_norm=True, max_seq_len=40960, rope_theta=1e6),
    "qwen3-32b": ModelConfig(vocab_size=151936, dim=5120, n_layers=64, n_heads=64, n_kv_heads=8, head_dim=128,
                             ffn_hidden=25600, qk_norm=True, max_seq_len=40960, rope_theta=1e6),
    "qwen3-30b-a3b": ModelConfig(vocab_size=151936, dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128,
                                 ffn_hidden=6144, qk_norm=True, max_seq_len=40960, rope_theta=1e6, n_experts=128,
                                 top_k=8, expert_ffn_hidden=768),
    "qwen3-235b-a22b": ModelConfig(vocab_size=151936, dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128,
                                   ffn_hidden=12288, qk_norm=True, max_seq_len=40960, rope_theta=1e6, n_experts=128,
                                   top_k=8, expert_ffn_hidden=1536),
    "gpt-oss-120b": ModelConfig(
        vocab_size=201088, dim=2880, n_layers=36, n_heads=64, n_kv_heads=8, head_dim=64, ffn_hidden=2880,
        max_seq_len=131072, rope_theta=150000.0, n_experts=128, top_k=4, expert_ffn_hidden=2880,
        note="approximate: every second layer's 128-token sliding window planned as full attention; attention "
             "sinks, biases and the clamped SwiGLU left out"),
    "gpt3-175b": ModelConfig(
        vocab_size=50257, dim=12288, n_layers=96, n_heads=96, n_kv_heads=96, ffn_hidden=49152,
        mlp="gelu", max_seq_len=2048, tie_embeddings=True,
        note="approximate: rotary instead of learned positions (-25M params), RMSNorm, no biases"),
}


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError("model.preset", name, f"{hint}known presets: {', '.join(PRESETS)}")
    return PRESETS[name]
