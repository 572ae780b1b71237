"""The shape of any decoder-only Hugging Face config, for planning.

`shoal train` starts only from the families its transformer computes exactly (hf_config.py), and refuses
the rest in one line. `shoal plan` needs only the shape: widths, layers, heads, experts. So a config of any
other family (GPT-OSS, Gemma, Phi-3, OLMo 2, Falcon, GPT-NeoX, ...) is read from the fields those families
spell alike, and what shoal's layer would count differently is approximated, and said in the model's note:

- a gated MLP (SwiGLU, GeGLU: three matrices) plans as SwiGLU; the families listed in PLAIN_MLP (two
  matrices, as GPT-2 and GPT-NeoX) as GeLU;
- sliding windows that differ from layer to layer (GPT-OSS, Gemma 2/3) plan as full attention, an upper
  bound on its time and memory, also where an older config.json says so only by `sliding_window_pattern` or
  its family's alternation (WINDOWS_ALTERNATE); one window for every layer (`sliding_window`) is kept, unless
  `use_sliding_window` turns it off (Qwen's MoE configs name a window they do not use); layers of other kinds
  (linear attention, Mamba mixers) plan as full attention layers too, and the note names them;
- biases, extra norms and the routers' scoring functions are left out (a few thousand parameters a layer);
- DeepSeek's multi-head latent attention is read wherever `kv_lora_rank` is given (Kimi K2 and other families
  built on DeepSeek-V3 under a model_type of their own);
- MoE on every k-th layer only (Llama 4 Maverick's interleave_moe_layer_step, Qwen-MoE's decoder_sparse_step)
  plans as the same number of MoE layers after the dense ones (the counts, and so the sizes and times, are
  the same; a pipeline's split is approximate);
- fields kept in nested `*_config` blocks (DBRX's attn_config and ffn_config) are read beside the top level's;
- a config that does not say whether the output head is tied takes its family's transformers default
  (TIED_BY_DEFAULT), as transformers itself reads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shoal.errors import UserError
from shoal.model.config import ModelConfig
from shoal.model.hf_config import ARCHITECTURES, REQUIRED, expert_groups, hf_config_to_model_config, mla_widths

PLAIN_MLP = ("gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "mpt", "phi", "starcoder2",
             "codegen", "nemotron", "nemotron_h")
"""Families whose MLP is two matrices around an activation (up, down; Nemotron's squared ReLU), not a gated three."""
TIED_BY_DEFAULT = ("gpt2", "gpt_bigcode", "opt", "bloom", "falcon", "mpt", "gemma", "gemma2", "gemma3_text", "minicpm",
                   "cohere")
"""Families whose transformers config class ties the output head to the embedding unless told otherwise. Saving a
config writes only what differs from its class's defaults, so their config.json says nothing when they tie."""
NOT_TRANSFORMERS = ("mamba", "mamba2", "rwkv", "rwkv5", "rwkv6", "rwkv7", "xlstm")
"""Families with no attention layers at all (state-space and recurrent models): nothing here plans them."""
SHAPE_NOTE = "planned from its shape"
"""How the note of a model read this way begins (`shoal plan` prints it under its headline)."""
QK_NORM = ("qwen3", "qwen3_moe", "olmo2", "gemma3", "gemma3_text")
"""Families that normalize each query and key head (planned as Qwen3's qk_norm)."""
WINDOWS_ALTERNATE = ("gemma2", "gemma3", "gemma3_text", "cohere2", "gpt_oss")
"""Families whose config class makes some layers sliding-window and the others global when the config.json
(saved before transformers wrote layer_types) names only the window: Gemma 2 every second layer, Gemma 3 five
of six (sliding_window_pattern), Command R7B three of four, GPT-OSS every second."""
ONE_SHARED_EXPERT = ("llama4_text",)
"""Families whose MoE layer always adds one shared expert as wide as a routed one, with no config field for
it (transformers' Llama4TextMoe: shared_expert = Llama4TextMLP(config))."""

# ModelConfig field -> the config.json names families give it, first found wins.
_ALIASES = {
    "dim": ("hidden_size", "n_embd", "d_model", "n_embed"),
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "n_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "n_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "kv_n_heads"),
    "ffn_hidden": ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "head_dim": ("head_dim",),
    "max_seq_len": ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len"),
    "n_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token", "moe_top_k", "num_selected_experts"),
    "expert_ffn_hidden": ("moe_intermediate_size", "expert_intermediate_size"),
    "moe_every": ("interleave_moe_layer_step", "decoder_sparse_step", "expert_layer_period"),
    "dense_ffn_hidden": ("intermediate_size_mlp",),
}
_REQUIRED = ("dim", "n_layers", "n_heads", "vocab_size")


def hf_config_to_shape(hf: Mapping) -> ModelConfig:
    """Any decoder config's shape: the exact conversion where shoal computes the family and what it asks,
    else the fields read by their common names (module docstring). One UserError when the shape is missing."""
    if isinstance(hf.get("text_config"), Mapping) and _first(hf, _ALIASES["dim"]) is None:
        # a multimodal model's folder (Gemma 3, Llama 4, Qwen2.5-VL): the language model it trains is text_config
        tied = {"tie_word_embeddings": hf["tie_word_embeddings"]} if "tie_word_embeddings" in hf else {}
        hf = {**tied, **hf["text_config"]}
    family = str(hf.get("model_type", "llama"))
    if family in NOT_TRANSFORMERS:
        raise UserError("hf.model_type", family, "is a state-space or recurrent model with no attention layers; "
                        "shoal plans transformer layers only")
    hf = _flattened(hf)
    why = f"model_type {family!r} is not a family shoal train computes"
    if family in ARCHITECTURES:
        try:
            return hf_config_to_model_config(hf)
        except UserError as exact:
            if exact.field.removeprefix("hf.") in REQUIRED:  # missing: the reader below has nothing more
                raise
            why = f"shoal train does not compute its {exact.field}={exact.value!r}"
    shape = {ours: _first(hf, names) for ours, names in _ALIASES.items()}
    for ours in _REQUIRED:
        if shape[ours] is None:
            raise UserError(f"hf.{_ALIASES[ours][0]}", None, f"config.json of model_type {family!r} gives no "
                            f"{' / '.join(_ALIASES[ours])}; plan the model by its shape flags instead")
    gated = family not in PLAIN_MLP
    dim, heads = shape["dim"], shape["n_heads"]
    kv = 1 if hf.get("multi_query") else shape["n_kv_heads"] or heads
    ffn = shape["ffn_hidden"] or 4 * dim
    fields = dict(vocab_size=shape["vocab_size"], dim=dim, n_layers=shape["n_layers"], n_heads=heads, n_kv_heads=kv,
                  ffn_hidden=ffn, mlp="swiglu" if gated else "gelu", max_seq_len=shape["max_seq_len"] or 2048,
                  tie_embeddings=bool(hf.get("tie_word_embeddings", family in TIED_BY_DEFAULT)),
                  qk_norm=family in QK_NORM, rope_theta=float(max(1, _first(hf, ("rope_theta",)) or 10000)))
    if shape["head_dim"] and shape["head_dim"] * heads != dim:
        fields["head_dim"] = shape["head_dim"]
    if isinstance(hf.get("kv_lora_rank"), int) and hf["kv_lora_rank"] > 0:  # DeepSeek's latent attention (Kimi K2)
        fields.update(mla_widths(hf), n_kv_heads=heads)
    window = hf.get("sliding_window") if hf.get("use_sliding_window") is not False else None  # Qwen's: off
    kinds = _layer_kinds(hf, family, window)
    windows_vary = len(kinds) > 1
    if isinstance(window, int) and window > 0 and not windows_vary:
        fields["sliding_window"] = window
    if shape["n_experts"]:
        expert = shape["expert_ffn_hidden"] or ffn
        shared = _first(hf, ("n_shared_experts",)) or (1 if family in ONE_SHARED_EXPERT else 0)
        if not shared and (wide := _first(hf, ("shared_expert_intermediate_size",))):  # one wide shared expert (Qwen2-MoE)
            shared = max(1, round(wide / expert))
        if not shared and hf.get("parallel_attn_mlp_res"):  # Arctic: a residual MLP hidden_size wide beside the MoE
            shared = max(1, round(dim / expert))  # (transformers' ArcticMLP, is_residual_mlp: ffn_dim = hidden_dim)
        dense = _first(hf, ("first_k_dense_replace",)) or 0
        if (shape["moe_every"] or 1) > 1:  # MoE on every k-th layer: that many MoE layers, the rest dense
            dense = shape["n_layers"] - shape["n_layers"] // shape["moe_every"]
        fields.update(n_experts=shape["n_experts"], top_k=shape["top_k"] or 2, expert_ffn_hidden=expert,
                      n_shared_experts=int(shared), n_dense_layers=dense,
                      ffn_hidden=shape["dense_ffn_hidden"] or ffn, **expert_groups(hf))
    other = ", ".join(sorted(kinds - {"full_attention", "attention"}))
    note = f"{SHAPE_NOTE}: {why}" + (f"; its layers of other kinds ({other}) planned as full-attention transformer layers"
                                     if windows_vary else "")
    try:
        return ModelConfig(**fields, note=note).validate(prefix="hf")
    except UserError as e:
        short = e.field.removeprefix("hf.")
        names = _ALIASES.get(short)
        raise UserError(f"hf.{names[0] if names else short}", e.value, e.fix) from None


def _layer_kinds(hf: Mapping, family: str, window) -> set[str]:
    """The kinds of layer a config names, where they differ from layer to layer: transformers' layer_types
    (Gemma's and GPT-OSS's sliding windows, Qwen3-Next's linear attention), Jamba's layers_block_type, and
    Nemotron-H's hybrid_override_pattern (M a Mamba mixer, * attention, - an MLP, E a mixture of experts).
    Configs saved before layer_types existed say it otherwise: a sliding_window_pattern (every n-th layer
    global: Gemma 3, Command R7B), or nothing where the family alternates by its config class (WINDOWS_ALTERNATE)."""
    kinds = hf.get("layer_types") or hf.get("layers_block_type")
    pattern = hf.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
        kinds = [names.get(c, c) for c in pattern]
    if isinstance(kinds, list):
        return {str(kind) for kind in kinds}
    every = hf.get("sliding_window_pattern")
    windowed = isinstance(window, int) and window > 0
    if windowed and (family in WINDOWS_ALTERNATE or isinstance(every, int) and every > 1):
        return {"sliding_attention", "full_attention"}
    return set()


def _flattened(hf: Mapping) -> dict:
    """The config with its nested blocks' fields beside its own (DBRX keeps heads and experts in attn_config and
    ffn_config); a field given at the top wins, and another model's block (a vision tower's) is not read."""
    flat = {}
    for key, value in hf.items():
        other_model = any(part in key for part in ("vision", "audio", "speech", "image", "quantization"))
        if isinstance(value, Mapping) and key.endswith("_config") and not other_model:
            flat.update({k: v for k, v in value.items() if k not in hf})
    return {**flat, **hf}


def _first(hf: Mapping, names: tuple[str, ...]):
    for name in names:
        value = hf.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
            return int(value)  # a string, null or Infinity where a count belongs is as good as absent
    return None
