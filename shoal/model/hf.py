"""Hugging Face Llama compatibility: read and write `LlamaForCausalLM` safetensors checkpoints.

A Hugging Face Llama directory is a `config.json` plus `model.safetensors` (or shards named by
`model.safetensors.index.json`). shoal's transformer is the same architecture with other
parameter names, and its rotary embedding already uses the Hugging Face rotate-half layout, so
q/k weights move across unchanged: only names (and the config's vocabulary) are translated.

Anything shoal cannot compute exactly (rope scaling, biases, another activation, a head_dim that
is not hidden/heads, MoE or GELU models on export) is refused with a `UserError` naming the
field, rather than converted into a model that silently computes something else.

Weights are read with safetensors only: nothing is ever unpickled.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from shoal.errors import UserError
from shoal.model.config import ModelConfig
from shoal.model.transformer import Transformer, build_model, rope_tables

CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"

# ModelConfig field -> LlamaConfig field, used both ways and to name HF fields in errors.
_HF_FIELD = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "ffn_hidden": "intermediate_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "tie_embeddings": "tie_word_embeddings",
}

# Defaults LlamaConfig uses when config.json leaves a field out.
_HF_DEFAULTS = {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}

# Per-layer parameter names (without "model.layers.{i}." and ".weight"): HF -> shoal.
_LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.up_proj": "feed_forward.w3",
    "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}
_TOP_NAMES = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output"}
_LAYER_NAMES_BACK = {v: k for k, v in _LAYER_NAMES.items()}
_TOP_NAMES_BACK = {v: k for k, v in _TOP_NAMES.items()}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.weight")
_SHOAL_LAYER = re.compile(r"layers\.(\d+)\.(.+)\.weight")


# ----------------------------------------------------------------------------------------------
# Names


def hf_to_shoal_name(name: str) -> str | None:
    """`model.layers.3.mlp.gate_proj.weight` -> `layers.3.feed_forward.w1.weight`; None if unknown."""
    if m := _HF_LAYER.fullmatch(name):
        inner = _LAYER_NAMES.get(m.group(2))
        return f"layers.{m.group(1)}.{inner}.weight" if inner else None
    top = _TOP_NAMES.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
    return f"{top}.weight" if top else None


def shoal_to_hf_name(name: str) -> str | None:
    """The inverse of `hf_to_shoal_name`; None for a name Llama has no place for (e.g. MoE experts)."""
    if m := _SHOAL_LAYER.fullmatch(name):
        inner = _LAYER_NAMES_BACK.get(m.group(2))
        return f"model.layers.{m.group(1)}.{inner}.weight" if inner else None
    top = _TOP_NAMES_BACK.get(name.removesuffix(".weight")) if name.endswith(".weight") else None
    return f"{top}.weight" if top else None


# ----------------------------------------------------------------------------------------------
# Config


def _rope_theta(hf: Mapping) -> float:
    """rope_theta from wherever this transformers version put it; refuses any rope scaling.

    transformers 4 writes a top-level `rope_theta` and an optional `rope_scaling` dict;
    transformers 5 writes a `rope_parameters` dict holding `rope_type` and `rope_theta`.
    """
    theta = hf.get("rope_theta")
    # Later sources win: rope_parameters is where transformers 5 keeps the value it actually uses.
    for key in ("rope_scaling", "rope_parameters"):
        params = hf.get(key)
        if not params:
            continue
        if not isinstance(params, Mapping):
            raise UserError(f"hf.{key}", params, "expected a JSON object with rope_type and rope_theta")
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in (None, "default"):
            raise UserError(f"hf.{key}", dict(params),
                            f"rope_type {kind!r} rescales the rotary frequencies, which shoal's rotary "
                            "embedding does not do; only plain RoPE (rope_type 'default') can be loaded")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            raise UserError(f"hf.{key}", dict(params), "partial rotary embeddings are not supported")
        theta = params.get("rope_theta", theta)
    return float(theta if theta is not None else 10000.0)


def hf_config_to_model_config(hf: Mapping) -> ModelConfig:
    """A Hugging Face LlamaConfig (as the dict in config.json) -> ModelConfig.

    Raises UserError("hf.<field>", value, fix) for anything shoal's transformer would compute
    differently from LlamaForCausalLM.
    """
    if hasattr(hf, "to_dict"):  # a transformers LlamaConfig object works too
        hf = hf.to_dict()
    model_type = hf.get("model_type", "llama")
    if model_type != "llama":
        raise UserError("hf.model_type", model_type, "only Llama checkpoints (model_type 'llama') can be loaded")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in hf:
            raise UserError(f"hf.{key}", None, "config.json lacks this required Llama field")
    if hf.get("hidden_act", "silu") != "silu":
        raise UserError("hf.hidden_act", hf["hidden_act"],
                        "shoal's SwiGLU uses silu; other activations are not supported")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise UserError(f"hf.{key}", hf[key],
                            "shoal's linear layers have no bias; only bias-free Llama models load")
    if hf.get("attention_dropout"):
        warnings.warn(f"hf.attention_dropout={hf['attention_dropout']} is ignored: shoal uses no dropout", stacklevel=2)

    values = {**_HF_DEFAULTS, **hf, "rope_theta": _rope_theta(hf)}
    if values.get("num_key_value_heads") is None:  # LlamaConfig's default: plain multi-head attention
        values["num_key_value_heads"] = values["num_attention_heads"]
    cfg = ModelConfig(**{ours: values[theirs] for ours, theirs in _HF_FIELD.items()})
    try:
        cfg.validate(prefix="hf")
    except UserError as e:  # report the field by its name in config.json, not shoal's
        short = e.field.removeprefix("hf.")
        raise UserError(f"hf.{_HF_FIELD.get(short, short)}", e.value, e.fix) from None
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim != cfg.head_dim:
        raise UserError("hf.head_dim", head_dim,
                        f"shoal requires head_dim = hidden_size / num_attention_heads = {cfg.head_dim}")
    return cfg


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_config_to_hf_config(cfg: ModelConfig, *, dtype: torch.dtype = torch.float32,
                              eos_token_id: int | None = None) -> dict:
    """ModelConfig -> the dict for a Hugging Face LlamaForCausalLM config.json.

    Written so both transformers 4 (top-level rope_theta, torch_dtype) and 5 (rope_parameters,
    dtype) read it. bos/eos are None unless given: a ModelConfig knows no tokenizer, and
    LlamaConfig's defaults (1 and 2) would be wrong for most of shoal's tokenizers.
    """
    if cfg.is_moe:
        raise UserError("model.n_experts", cfg.n_experts,
                        "an MoE model has no LlamaForCausalLM equivalent; only dense models can be exported")
    if cfg.mlp != "swiglu":
        raise UserError("model.mlp", cfg.mlp, "Llama's feed-forward is SwiGLU; a GELU MLP cannot be exported")
    cfg.validate()
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **{theirs: getattr(cfg, ours) for ours, theirs in _HF_FIELD.items()},
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "dtype": _dtype_name(dtype),
        "torch_dtype": _dtype_name(dtype),
    }


# ----------------------------------------------------------------------------------------------
# Weights


def _weight_files(directory: Path) -> list[Path]:
    """model.safetensors, or every shard the index names."""
    if (directory / WEIGHTS).is_file():
        return [directory / WEIGHTS]
    if (directory / INDEX).is_file():
        shards = sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
        for shard in shards:
            if not (directory / shard).is_file():
                raise UserError("hf_dir", str(directory), f"{INDEX} names {shard}, which is missing; fetch every shard")
        return [directory / shard for shard in shards]
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        raise UserError("hf_dir", str(directory),
                        "holds only pickled PyTorch weights, which shoal never loads; convert them to "
                        "safetensors first (e.g. save_pretrained(..., safe_serialization=True))")
    raise UserError("hf_dir", str(directory), f"holds neither {WEIGHTS} nor {INDEX}")


def _few(names) -> str:
    names = sorted(names)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def load_hf_llama(directory: str | Path, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32) -> Transformer:
    """Load a Hugging Face Llama directory into a shoal Transformer (eval mode; fp32 by default).

    Every tensor's name and shape is checked against config.json before any data is read; a
    missing, unexpected or misshapen tensor is a UserError. Tensors are copied one at a time into
    an unallocated-then-emptied model, so peak memory is about one model, not two.
    """
    directory = Path(directory)
    if not (directory / CONFIG).is_file():
        raise UserError("hf_dir", str(directory),
                        f"has no {CONFIG}; pass a directory written by save_pretrained or save_hf_llama")
    cfg = hf_config_to_model_config(json.loads((directory / CONFIG).read_text()))

    # Build without initializing: every parameter is overwritten below.
    model = build_model(cfg, device="meta").to(dtype).to_empty(device=device)
    if cfg.tie_embeddings:  # re-tie in case to_empty gave the two names separate storage
        model.output.weight = model.tok_embeddings.weight
    # The rotary table is a non-persistent buffer: to_empty left it garbage; it stays fp32.
    model.rope = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, device=device)
    params = dict(model.named_parameters())  # tied: the output head is listed once, as the embedding

    # Pass 1, headers only: where each tensor lives, and is everything there and the right shape?
    sources: dict[str, tuple[Path, str]] = {}
    unexpected = []
    for path in _weight_files(directory):
        with safe_open(str(path), framework="pt") as f:
            for hf_name in f.keys():
                if hf_name.endswith("rotary_emb.inv_freq"):
                    continue  # old conversions saved this derived buffer; shoal recomputes it
                name = hf_to_shoal_name(hf_name)
                if cfg.tie_embeddings and name == "output.weight":
                    continue  # tied: like transformers, the embedding is the head and lm_head is ignored
                if name not in params:
                    unexpected.append(hf_name)
                    continue
                shape = tuple(f.get_slice(hf_name).get_shape())
                if shape != tuple(params[name].shape):
                    raise UserError(f"hf.{hf_name}", shape,
                                    f"config.json implies shape {tuple(params[name].shape)}")
                sources[name] = (path, hf_name)
    if unexpected:
        raise UserError("hf_dir", str(directory),
                        f"has tensors a Llama with this config.json does not: {_few(unexpected)}")
    missing = [shoal_to_hf_name(n) for n in params if n not in sources]
    if missing:
        raise UserError("hf_dir", str(directory), f"lacks tensors this config.json needs: {_few(missing)}")

    # Pass 2: copy the data, one file open at a time; copy_ casts to the model's dtype and device.
    by_file: dict[Path, list[str]] = {}
    for name, (path, _) in sources.items():
        by_file.setdefault(path, []).append(name)
    with torch.no_grad():
        for path, names in by_file.items():
            with safe_open(str(path), framework="pt") as f:
                for name in names:
                    params[name].copy_(f.get_tensor(sources[name][1]))
    return model.eval()


def save_hf_llama(model_or_state_dict: nn.Module | Mapping[str, torch.Tensor], cfg: ModelConfig,
                  directory: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write config.json + model.safetensors that transformers' LlamaForCausalLM loads.

    Takes a plain single-device model or its full (gathered, non-DTensor) state dict. With tied
    embeddings the file has no lm_head.weight, as transformers writes it. Returns the directory.
    """
    hf_config = model_config_to_hf_config(cfg, dtype=dtype)  # refuses MoE/GELU before touching disk
    if isinstance(model_or_state_dict, nn.Module):
        state = model_or_state_dict.state_dict()
    else:
        state = dict(model_or_state_dict)
    # The names and shapes this config's model has, from a model that allocates nothing.
    expected = {n: tuple(p.shape) for n, p in build_model(cfg, device="meta").named_parameters()}
    if cfg.tie_embeddings:
        state.pop("output.weight", None)  # the same tensor as the embedding; Llama stores it once

    unexpected, missing = set(state) - set(expected), set(expected) - set(state)
    if unexpected or missing:
        raise UserError("model_or_state_dict", f"{len(state)} tensors",
                        f"does not match the config: unexpected {_few(unexpected) or 'none'}; "
                        f"missing {_few(missing) or 'none'}")
    tensors = {}
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise UserError(f"model_or_state_dict.{name}", tuple(tensor.shape), f"the config implies {expected[name]}")
        tensors[shoal_to_hf_name(name)] = tensor.detach().to(device="cpu", dtype=dtype).contiguous()

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # transformers checks this metadata and refuses safetensors files that lack it.
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})
    (directory / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n")
    return directory
