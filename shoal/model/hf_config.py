"""Hugging Face model configs <-> ModelConfig, for the families shoal's transformer computes exactly.

| model_type | what differs from plain Llama, and where it goes in ModelConfig |
|---|---|
| `llama` (1, 2, 3.x) | `rope_scaling` llama3 / linear / yarn; an explicit `head_dim` |
| `mistral` | `sliding_window` (null: plain Llama math) |
| `qwen2` (2, 2.5) | biases on q/k/v (`qkv_bias`) |
| `qwen3` | an RMSNorm on each query and key head (`qk_norm`); `head_dim` |
| `mixtral` | every layer MoE: router top-k, weights renormalized, no shared expert |
| `qwen3_moe` | Qwen3 attention, MoE layers (`norm_topk_prob`, dense `mlp_only_layers` first) |
| `deepseek_v2`, `deepseek_v3` | planned only: multi-head latent attention (`kv_lora_rank`, `q_lora_rank`, `qk_rope_head_dim`, `v_head_dim`; head_dim = `qk_nope_head_dim` + `qk_rope_head_dim`), shared experts, `first_k_dense_replace` dense layers, group-limited routing (`n_group`, `topk_group`: planned only); their routing (V3's sigmoid) read as softmax top-k. shoal train refuses MLA (`model.kv_lora_rank`) |

Anything else a config asks for that shoal would compute differently (another activation, biases on
the output projection or the MLP, per-layer sliding windows, partial rotary embeddings, another
RoPE type) is refused with one UserError naming the field in config.json, never converted into a
model that silently computes something else. Both transformers 4 (top-level `rope_theta`,
`rope_scaling`) and 5 (`rope_parameters`) spellings are read; exports write both.

No torch here: the job config reads a model folder's shape through this module before anything is built.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from shoal.errors import UserError, first_line
from shoal.model.config import ModelConfig

CONFIG = "config.json"

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                 "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
"""config.json fields every family here must give."""
MOE_FAMILIES = ("mixtral", "qwen3_moe")
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3")
"""Read for planning: shoal's transformer has no multi-head latent attention (build_model refuses it)."""

# ModelConfig field -> config.json field, the same in every family here (and in errors).
_COMMON = {"vocab_size": "vocab_size", "dim": "hidden_size", "ffn_hidden": "intermediate_size",
           "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads",
           "max_seq_len": "max_position_embeddings", "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
_DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
"""What transformers' configs assume when config.json leaves a field out (Llama's; the others agree)."""
_ROPE = {"rope_factor": "factor", "rope_original_max_len": "original_max_position_embeddings",
         "rope_low_freq_factor": "low_freq_factor", "rope_high_freq_factor": "high_freq_factor",
         "rope_beta_fast": "beta_fast", "rope_beta_slow": "beta_slow", "rope_attention_factor": "attention_factor"}
_ROPE_USES = {"linear": ("rope_factor",), "llama3": ("rope_factor", "rope_original_max_len", "rope_low_freq_factor",
                                                   "rope_high_freq_factor"),
              "yarn": ("rope_factor", "rope_original_max_len", "rope_beta_fast", "rope_beta_slow",
                       "rope_attention_factor")}


def read_hf_config(directory: Path) -> dict:
    """config.json of a Hugging Face model folder, or one line saying why it is not one."""
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise UserError("hf_dir", str(directory), f"has no {CONFIG}; pass a folder written by save_pretrained")
    try:  # utf-8-sig: a byte order mark, which editors on Windows add, is not a mistake
        hf = json.loads(path.read_bytes().decode("utf-8-sig"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UserError("hf_dir", str(directory), f"has an unreadable {CONFIG} ({first_line(e)}); fetch it "
                                                  "again") from None
    if not isinstance(hf, dict):
        raise UserError("hf_dir", str(directory), f"has a {CONFIG} that is not a JSON object")
    return hf


def family_of(hf: Mapping) -> str:
    family = hf.get("model_type", "llama")
    if family not in ARCHITECTURES:
        raise UserError("hf.model_type", family, f"shoal computes these families exactly: {', '.join(a for a in ARCHITECTURES if a not in MLA_FAMILIES)} "
                        f"(and plans {', '.join(MLA_FAMILIES)})")
    return family


def hf_config_to_model_config(hf: Mapping) -> ModelConfig:
    """A Hugging Face config (the dict in config.json, or a transformers config object) -> ModelConfig.
    Raises UserError("hf.<field>", value, fix) for anything shoal would compute differently."""
    if hasattr(hf, "to_dict"):
        hf = hf.to_dict()
    family = family_of(hf)
    for key in REQUIRED:
        if key not in hf:
            raise UserError(f"hf.{key}", None, f"config.json lacks this required {family} field")
    _refuse_what_shoal_does_not_compute(hf, family)
    values = {**_DEFAULTS, **hf}
    if values.get("num_key_value_heads") is None:  # the configs' default: plain multi-head attention
        values["num_key_value_heads"] = values["num_attention_heads"]
    fields = {ours: values[theirs] for ours, theirs in _COMMON.items()}
    fields["head_dim"] = 0 if hf.get("head_dim") is None else hf["head_dim"]
    # The counts checked before any arithmetic below uses them: a string, a zero or a typo's billion
    # layers in config.json is one line, not a TypeError, a ZeroDivisionError or a long loop.
    _validated(ModelConfig(**fields))
    if fields["head_dim"] == fields["dim"] // fields["n_heads"]:
        fields["head_dim"] = 0  # the derived width, said explicitly (transformers 5 writes it)
    fields.update(_rope(hf), qkv_bias=family == "qwen2", qk_norm=family in ("qwen3", "qwen3_moe"),
                  sliding_window=_sliding_window(hf, family, fields["max_seq_len"]))
    if family in MOE_FAMILIES:
        fields.update(_moe(hf, family))
    if family in MLA_FAMILIES:
        fields.update(_deepseek(hf))
    return _validated(ModelConfig(**fields), _expert_names(hf, family))


def _validated(cfg: ModelConfig, names: Mapping[str, str] | None = None) -> ModelConfig:
    """cfg.validate(), its mistake reported by the field's name in config.json (`names` beside _COMMON's), not
    shoal's."""
    try:
        return cfg.validate(prefix="hf")
    except UserError as e:
        short = e.field.removeprefix("hf.")
        raise UserError(f"hf.{(names or {}).get(short) or _COMMON.get(short, short)}", e.value, e.fix) from None


def _expert_names(hf: Mapping, family: str) -> dict[str, str]:
    """config.json's names for the expert fields _moe and _deepseek read, as each family spells them."""
    if family not in MOE_FAMILIES and family not in MLA_FAMILIES:
        return {}
    experts = next((k for k in ("n_routed_experts", "num_experts", "num_local_experts") if hf.get(k)), "num_experts")
    return {"n_experts": experts, "top_k": "num_experts_per_tok",
            "expert_ffn_hidden": "intermediate_size" if family == "mixtral" else "moe_intermediate_size"}


def _refuse_what_shoal_does_not_compute(hf: Mapping, family: str) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError("hf.hidden_act", hf["hidden_act"], "shoal's SwiGLU uses silu; other activations are not supported")
    if hf.get("mlp_bias"):
        raise UserError("hf.mlp_bias", hf["mlp_bias"], "shoal's feed-forward layers have no bias")
    if hf.get("attention_bias") and family != "qwen2":  # Llama's and Qwen3's put one on the output projection too
        raise UserError("hf.attention_bias", hf["attention_bias"],
                        "a bias on the attention's output projection is not supported (only q/k/v biases, Qwen2's)")
    if family == "qwen2" and hf.get("use_sliding_window"):
        raise UserError("hf.use_sliding_window", True, "Qwen2's per-layer sliding window is not supported")
    if hf.get("partial_rotary_factor", 1.0) not in (None, 1.0):  # transformers 5 moves it into rope_parameters
        raise UserError("hf.partial_rotary_factor", hf["partial_rotary_factor"],
                        "partial rotary embeddings are not supported")
    if quantized := hf.get("quantization_config"):
        method = quantized.get("quant_method", quantized) if isinstance(quantized, Mapping) else quantized
        raise UserError("hf.quantization_config", method, "quantized weights are not read; start from the "
                                                          "model's unquantized (bf16/fp16/fp32) release")
    kinds = hf.get("layer_types")
    if isinstance(kinds, list) and len(set(kinds)) > 1:
        raise UserError("hf.layer_types", sorted(set(kinds)), "layers with different attention patterns are not supported")


def _sliding_window(hf: Mapping, family: str, max_positions: int):
    """Mistral's and Mixtral's window (null: none); the Qwen families' only with use_sliding_window.
    A value that is not a count is returned as it is, for validate to name."""
    window = hf.get("sliding_window") if family in ("mistral", "mixtral") else None
    if window is None or isinstance(window, int) and window >= max_positions:
        return 0  # a window as long as the model's context changes nothing
    return window


def _rope(hf: Mapping) -> dict:
    """rope_theta and its scaling from wherever this transformers version put them."""
    fields = {"rope_theta": hf.get("rope_theta")}
    for key in ("rope_scaling", "rope_parameters"):  # later wins: transformers 5 keeps what it uses in the second
        params = hf.get(key)
        if not params:
            continue
        if not isinstance(params, Mapping):
            raise UserError(f"hf.{key}", params, "expected a JSON object with rope_type and rope_theta")
        kind = params.get("rope_type", params.get("type", "default")) or "default"
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise UserError(f"hf.{key}", dict(params), "partial rotary embeddings are not supported")
        if kind not in ("default", *_ROPE_USES):
            raise UserError(f"hf.{key}", dict(params), f"rope_type {kind!r} is not supported; shoal rescales rotary "
                                                       f"frequencies as default, {', '.join(_ROPE_USES)}")
        if params.get("truncate") is False:
            raise UserError(f"hf.{key}", dict(params), "yarn without truncation is not supported")
        fields["rope_theta"] = params.get("rope_theta", fields["rope_theta"])
        fields["rope_scaling"] = "none" if kind == "default" else kind
        for ours, theirs in _ROPE.items():
            if params.get(theirs) is not None:
                fields[ours] = params[theirs]
        if kind == "yarn":
            fields.update(_yarn(params, hf))
    theta = fields["rope_theta"]
    if theta is None:
        fields["rope_theta"] = 10000.0
    elif isinstance(theta, int) and not isinstance(theta, bool):
        fields["rope_theta"] = float(theta)  # anything else not a number is left for validate to name
    return fields


def _yarn(params: Mapping, hf: Mapping) -> dict:
    """YaRN's factor and attention scaling as transformers derives them when the config leaves them out."""
    out = {}
    factor = params.get("factor")
    if factor is None and params.get("original_max_position_embeddings"):
        factor = hf.get("max_position_embeddings", 0) / params["original_max_position_embeddings"]
        out["rope_factor"] = factor
    if params.get("attention_factor") is None and params.get("mscale") and params.get("mscale_all_dim") and factor:
        def m(scale_of):  # DeepSeek's 0.1 * mscale * ln(factor) + 1
            return 0.1 * scale_of * math.log(factor) + 1.0 if factor > 1 else 1.0
        out["rope_attention_factor"] = m(params["mscale"]) / m(params["mscale_all_dim"])
    return out


def _moe(hf: Mapping, family: str) -> dict:
    if hf.get("n_shared_experts") or hf.get("shared_expert_intermediate_size"):
        raise UserError("hf.shared_expert_intermediate_size", hf.get("shared_expert_intermediate_size"),
                        "gated shared experts are not supported")
    if family == "mixtral":
        return dict(n_experts=hf.get("num_local_experts", 8), top_k=hf.get("num_experts_per_tok", 2),
                    expert_ffn_hidden=hf["intermediate_size"], router_renormalize=True,
                    aux_loss_coef=hf.get("router_aux_loss_coef", 0.001))
    dense, step = hf.get("mlp_only_layers") or [], hf.get("decoder_sparse_step", 1)
    if not (isinstance(dense, list) and all(_count(i) for i in dense)):
        raise UserError("hf.mlp_only_layers", dense, "must be a list of layer numbers, e.g. [0, 1]")
    if not (_count(step) and step > 0):
        raise UserError("hf.decoder_sparse_step", step, "must be a positive integer (1: every layer is MoE)")
    dense = sorted(dense)
    moe_layers = [i for i in range(hf["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]
    n_dense = moe_layers[0] if moe_layers else 0
    every = moe_layers[1] - moe_layers[0] if len(moe_layers) > 1 else 1
    if not moe_layers or moe_layers != list(range(n_dense, hf["num_hidden_layers"], every)):
        raise UserError("hf.mlp_only_layers", dense, f"shoal's MoE layers are every k-th after the first dense ones; "
                                                     f"these ({moe_layers}) are another pattern")
    # transformers 4 writes num_experts, 5 num_local_experts
    return dict(n_experts=hf.get("num_experts") or hf.get("num_local_experts") or 128, top_k=hf.get("num_experts_per_tok", 8),
                expert_ffn_hidden=hf.get("moe_intermediate_size", hf["intermediate_size"]),
                router_renormalize=bool(hf.get("norm_topk_prob", False)), n_dense_layers=n_dense, moe_every=every,
                aux_loss_coef=hf.get("router_aux_loss_coef", 0.001))


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _deepseek(hf: Mapping) -> dict:
    """DeepSeek-V2/V3's MLA widths (DeepSeek-V2 paper §2.1) and MoE layout (modeling_deepseek.py: layer i
    is MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0)."""
    for key in ("kv_lora_rank", "n_routed_experts", "moe_intermediate_size"):
        if not hf.get(key):
            raise UserError(f"hf.{key}", hf.get(key), "config.json lacks this required DeepSeek field")
    if hf.get("moe_layer_freq", 1) != 1:
        raise UserError("hf.moe_layer_freq", hf["moe_layer_freq"], "only every layer after the dense ones is read")
    return dict(**mla_widths(hf), n_experts=hf["n_routed_experts"], top_k=hf.get("num_experts_per_tok", 8),
                expert_ffn_hidden=hf["moe_intermediate_size"], n_shared_experts=hf.get("n_shared_experts") or 0,
                n_dense_layers=hf.get("first_k_dense_replace", 0),
                router_renormalize=bool(hf.get("norm_topk_prob", False)), **expert_groups(hf))


def expert_groups(hf: Mapping) -> dict:
    """DeepSeek's group-limited routing as its config.json names it (modeling_deepseek.py MoEGate: topk_method
    group_limited_greedy (V2) or noaux_tc (V3) picks topk_group of n_group expert groups first; greedy, no
    groups): the fields ModelConfig.expert_groups and expert_groups_per_token, or none where nothing is limited."""
    groups, per_token = hf.get("n_group"), hf.get("topk_group")
    if hf.get("topk_method", "noaux_tc") == "greedy" or not (_count(groups) and _count(per_token)):
        return {}
    return dict(expert_groups=groups, expert_groups_per_token=per_token) if 0 < per_token < groups else {}


def mla_widths(hf: Mapping) -> dict:
    """Multi-head latent attention's widths as DeepSeek-V2's config.json names them (its paper §2.1; the same
    names in V3 and the families built on it, Kimi K2 among them): a query head is qk_nope_head_dim plus
    qk_rope_head_dim wide."""
    rope = hf.get("qk_rope_head_dim", 64)
    return dict(head_dim=hf.get("qk_nope_head_dim", 128) + rope, q_lora_rank=hf.get("q_lora_rank") or 0,
                kv_lora_rank=hf["kv_lora_rank"], qk_rope_head_dim=rope, v_head_dim=hf.get("v_head_dim", 128))


def export_family(cfg: ModelConfig) -> str:
    """The Hugging Face family whose model computes what `cfg` does, or one line saying there is none."""
    if cfg.is_mla:
        raise UserError("model.kv_lora_rank", cfg.kv_lora_rank, "multi-head latent attention is planned only; "
                        "shoal writes no DeepSeek family")
    if cfg.mlp != "swiglu":
        raise UserError("model.mlp", cfg.mlp, "the Hugging Face families shoal writes use SwiGLU; a GELU MLP cannot be exported")
    if cfg.is_moe:
        if cfg.n_shared_experts:
            raise UserError("model.n_shared_experts", cfg.n_shared_experts,
                            "neither Mixtral nor Qwen3-MoE has shared experts; such a model cannot be exported")
        if cfg.qkv_bias or cfg.sliding_window and cfg.qk_norm:
            raise UserError("model.qkv_bias" if cfg.qkv_bias else "model.sliding_window",
                            cfg.qkv_bias or cfg.sliding_window, "no MoE family here has this attention")
        plain = not cfg.qk_norm and cfg.router_renormalize and cfg.n_dense_layers == 0 and cfg.moe_every == 1
        if plain and cfg.expert_hidden == cfg.ffn_hidden:
            return "mixtral"
        if not cfg.qk_norm:
            raise UserError("model.qk_norm", False, "an MoE model with dense layers or unnormalized routing exports "
                                                    "as Qwen3-MoE, whose attention normalizes q and k; this one does not")
        return "qwen3_moe"
    if cfg.qk_norm:
        if cfg.qkv_bias or cfg.sliding_window:
            raise UserError("model.qk_norm", True, "no family here has q/k norms with q/k/v biases or a sliding window")
        return "qwen3"
    if cfg.qkv_bias:
        if cfg.sliding_window:
            raise UserError("model.sliding_window", cfg.sliding_window, "Qwen2's sliding window is per layer; not exported")
        return "qwen2"
    return "mistral" if cfg.sliding_window else "llama"


def model_config_to_hf_config(cfg: ModelConfig, *, dtype: str = "float32", bos_token_id: int | None = None,
                              eos_token_id: int | None = None) -> dict:
    """ModelConfig -> the config.json of the family that computes it (export_family), readable by
    transformers 4 (top-level rope_theta, rope_scaling, torch_dtype) and 5 (rope_parameters, dtype)."""
    cfg.validate()
    family = export_family(cfg)
    rope = {"rope_type": "default" if cfg.rope_scaling == "none" else cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    rope.update({theirs: getattr(cfg, ours) for ours, theirs in _ROPE.items() if ours in _ROPE_USES.get(cfg.rope_scaling, ())
                 and not (ours == "rope_attention_factor" and not cfg.rope_attention_factor)})
    hf = {"architectures": [ARCHITECTURES[family]], "model_type": family,
          **{theirs: getattr(cfg, ours) for ours, theirs in _COMMON.items()},
          "head_dim": cfg.head_size, "rope_theta": cfg.rope_theta, "rope_parameters": rope,
          "rope_scaling": None if cfg.rope_scaling == "none" else rope, "hidden_act": "silu",
          "attention_bias": family == "qwen2" and cfg.qkv_bias, "mlp_bias": False, "attention_dropout": 0.0,
          "sliding_window": cfg.sliding_window or None, "use_sliding_window": False,
          "bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "dtype": dtype, "torch_dtype": dtype}
    if family == "mixtral":
        hf.update(num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.top_k, intermediate_size=cfg.expert_hidden,
                  router_aux_loss_coef=cfg.aux_loss_coef, output_router_logits=False)
    if family == "qwen3_moe":
        dense = [i for i in range(cfg.n_layers) if not cfg.is_moe_layer(i)]
        hf.update(num_experts=cfg.n_experts, num_local_experts=cfg.n_experts, num_experts_per_tok=cfg.top_k,
                  moe_intermediate_size=cfg.expert_hidden,
                  norm_topk_prob=cfg.router_renormalize, mlp_only_layers=dense, decoder_sparse_step=1,
                  router_aux_loss_coef=cfg.aux_loss_coef, output_router_logits=False)
    return hf
