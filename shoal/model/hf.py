"""Hugging Face checkpoints in and out: tensor names, a reader that serves any tensor (or the slice a
rank holds) by shoal's name, and whole-model load and save. The configs are hf_config.py's.

shoal's transformer is the same architecture as the families hf_config.py lists, with other names,
and its rotary embedding uses the Hugging Face rotate-half layout, so most weights move across
unchanged. Routed experts are the exception: shoal stacks them as w1, w3 [E, D, F] and w2 [E, F, D];
checkpoints hold them per expert as [F, D] and [D, F] matrices (transformers 4, and what the Hub
mostly holds: Mixtral's `block_sparse_moe.experts.{e}.w1`, Qwen3-MoE's `mlp.experts.{e}.gate_proj`) or
fused per layer (transformers 5: `mlp.experts.gate_up_proj` [E, 2F, D], `down_proj` [E, D, F]).
Both are read; exports write the per-expert form, which both versions load.

Weights are read with safetensors only: nothing is ever unpickled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from shoal.errors import UserError
from shoal.model.config import ModelConfig
from shoal.model.hf_config import (CONFIG, export_family, family_of, hf_config_to_model_config, model_config_to_hf_config,
                                   read_hf_config)
from shoal.model.transformer import Transformer, build_model

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
FLOAT_DTYPES = ("F64", "F32", "BF16", "F16")
"""safetensors' names of the dtypes a weight is read from. Any other (F8_E4M3, I8, U8, BOOL: quantized or
packed weights whose config.json does not say so) would be cast into values the model never had."""

# Parameter names inside a layer (without "model.layers.{i}." and ".weight"/".bias"): HF -> shoal.
_LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo", "self_attn.q_norm": "attention.q_norm", "self_attn.k_norm": "attention.k_norm",
    "mlp.gate_proj": "feed_forward.w1", "mlp.up_proj": "feed_forward.w3", "mlp.down_proj": "feed_forward.w2",
    "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm",
    "mlp.gate": "feed_forward.router", "block_sparse_moe.gate": "feed_forward.router",
}
_TOP_NAMES = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output"}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
_SHOAL_LAYER = re.compile(r"layers\.(\d+)\.(.+)\.(weight|bias)")
_SHOAL_EXPERTS = re.compile(r"layers\.(\d+)\.feed_forward\.experts\.(w1|w2|w3)")
# Per-expert matrices of one layer: shoal's stacked tensor -> the expert's matrix in each family's names.
_EXPERT_NAMES = {"mixtral": {"w1": "block_sparse_moe.experts.{e}.w1", "w3": "block_sparse_moe.experts.{e}.w3",
                             "w2": "block_sparse_moe.experts.{e}.w2"},
                 "qwen3_moe": {"w1": "mlp.experts.{e}.gate_proj", "w3": "mlp.experts.{e}.up_proj",
                               "w2": "mlp.experts.{e}.down_proj"}}
_ROUTER = {"mixtral": "block_sparse_moe.gate", "qwen3_moe": "mlp.gate"}


def hf_to_shoal_name(name: str) -> str | None:
    """`model.layers.3.mlp.gate_proj.weight` -> `layers.3.feed_forward.w1.weight`; None for a name
    that is not one tensor of shoal's (routed experts are stacked: see HFWeights)."""
    if m := _HF_LAYER.fullmatch(name):
        inner = _LAYER_NAMES.get(m.group(2))
        return f"layers.{m.group(1)}.{inner}.{m.group(3)}" if inner else None
    stem, _, kind = name.rpartition(".")
    top = _TOP_NAMES.get(stem) if kind == "weight" else None
    return f"{top}.weight" if top else None


def shoal_to_hf_name(name: str, family: str = "llama") -> str | None:
    """The inverse of `hf_to_shoal_name` in `family`'s names; None for the stacked experts."""
    if m := _SHOAL_LAYER.fullmatch(name):
        if m.group(2) == "feed_forward.router":
            return f"model.layers.{m.group(1)}.{_ROUTER.get(family, 'mlp.gate')}.{m.group(3)}"
        inner = next((hf for hf, ours in _LAYER_NAMES.items() if ours == m.group(2)), None)
        return f"model.layers.{m.group(1)}.{inner}.{m.group(3)}" if inner else None
    stem = name.removesuffix(".weight")
    top = next((hf for hf, ours in _TOP_NAMES.items() if ours == stem), None) if name.endswith(".weight") else None
    return f"{top}.weight" if top else None


def _weight_files(directory: Path) -> list[Path]:
    """model.safetensors, or every shard the index names."""
    for name in (WEIGHTS, INDEX):  # a Hub cache's snapshot links into blobs/, which a copy may have left behind
        if (directory / name).is_symlink() and not (directory / name).exists():
            raise UserError("hf_dir", str(directory), f"{name} is a broken symbolic link (to "
                                                      f"{(directory / name).readlink()}); copy the folder with the "
                                                      "files its links point to (cp -rL) or download it again")
    if (directory / WEIGHTS).is_file():
        return [directory / WEIGHTS]
    if (directory / INDEX).is_file():
        try:
            shards = sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
            if not all(isinstance(shard, str) for shard in shards):
                raise TypeError("a shard that is not a file name")
        except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, or no {"weight_map": {name: file}}
            raise UserError("hf_dir", str(directory), f'{INDEX} is not {{"weight_map": {{tensor: file}}}}; fetch it '
                                                      "again") from None
        for shard in shards:
            if not (directory / shard).is_file():
                raise UserError("hf_dir", str(directory), f"{INDEX} names {shard}, which is missing; fetch every shard")
        return [directory / shard for shard in shards]
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        raise UserError("hf_dir", str(directory),
                        "holds only pickled PyTorch weights, which shoal never loads; convert them to "
                        "safetensors first (e.g. save_pretrained(..., safe_serialization=True))")
    raise UserError("hf_dir", str(directory), f"holds neither {WEIGHTS} nor {INDEX}")


def hf_config_family(directory: Path) -> str:
    return family_of(read_hf_config(directory)) if (directory / CONFIG).is_file() else "llama"


def _few(names) -> str:
    names = sorted(names)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


Index = tuple[slice, ...]
"""Which part of a tensor to read: one slice per dimension (the part a rank holds)."""


class HFWeights:
    """The tensors of a Hugging Face folder by shoal's names, for the model `cfg` describes (its
    config.json's): every name and shape is checked against the model from the files' headers
    alone, before any data is read; `read(name, index)` then reads one tensor, or only the part of
    it a rank holds (safetensors reads slices)."""

    def __init__(self, directory: str | Path, cfg: ModelConfig):
        self.directory, self.cfg = Path(directory), cfg
        self.expected = {n: tuple(p.shape) for n, p in build_model(cfg, device="meta").named_parameters()}
        self._where: dict[str, Path] = {}  # HF name -> file
        self._shape: dict[str, tuple] = {}
        self._dtype: dict[str, str] = {}
        for path in _weight_files(self.directory):
            try:
                with safe_open(str(path), framework="pt") as f:
                    for hf_name in f.keys():
                        if not hf_name.endswith("rotary_emb.inv_freq"):  # a derived buffer old conversions saved
                            part = f.get_slice(hf_name)
                            self._where[hf_name] = path
                            self._shape[hf_name], self._dtype[hf_name] = tuple(part.get_shape()), part.get_dtype()
            except Exception as e:  # safetensors raises its own error types for a truncated or garbled file
                raise UserError("hf_dir", str(self.directory), f"{path.name} cannot be read as safetensors "
                                                               f"({type(e).__name__}); fetch it again") from None
        self._sources = self._match()

    def _match(self) -> dict[str, tuple]:
        """shoal name -> how to read it: ("one", hf name) or ("experts", form, layer, which)."""
        sources, used = {}, set()
        for hf_name in self._shape:
            name = hf_to_shoal_name(hf_name)
            if self.cfg.tie_embeddings and name == "output.weight":
                used.add(hf_name)  # tied: like transformers, the embedding is the head and lm_head is ignored
            elif name in self.expected:
                sources[name] = ("one", hf_name)
                used.add(hf_name)
        for name in self.expected:
            if m := _SHOAL_EXPERTS.fullmatch(name):
                source = self._experts(int(m.group(1)), m.group(2))
                if source is not None:
                    sources[name] = source
                    used.update(source[2])
        unexpected = set(self._shape) - used
        if unexpected:
            raise UserError("hf_dir", str(self.directory), f"has tensors this config.json's model does not: {_few(unexpected)}")
        missing = set(self.expected) - set(sources)
        if missing:
            family = hf_config_family(self.directory)
            named = [shoal_to_hf_name(n, family) or f"{n} (per expert)" for n in missing]
            raise UserError("hf_dir", str(self.directory), f"lacks tensors this config.json's model needs: {_few(named)}")
        for name, source in sources.items():
            if source[0] == "one" and self._shape[source[1]] != self.expected[name]:
                raise UserError(f"hf.{source[1]}", self._shape[source[1]], f"config.json implies shape {self.expected[name]}")
        read = {n for source in sources.values() for n in ([source[1]] if source[0] == "one" else source[2])}
        for hf_name in sorted(read):
            if self._dtype[hf_name] not in FLOAT_DTYPES:
                raise UserError(f"hf.{hf_name}", self._dtype[hf_name], f"weights are read from "
                                f"{', '.join(FLOAT_DTYPES)} tensors; start from the model's unquantized release")
        return sources

    def _experts(self, layer: int, which: str):
        """Where layer `layer`'s stacked expert tensor `which` lives: per expert, or fused (None: neither)."""
        E, F, D = self.cfg.n_experts, self.cfg.expert_hidden, self.cfg.dim
        for family, names in _EXPERT_NAMES.items():
            per_expert = [f"model.layers.{layer}.{names[which].format(e=e)}.weight" for e in range(E)]
            if all(n in self._shape for n in per_expert):
                want = (F, D) if which != "w2" else (D, F)
                for n in per_expert:
                    if self._shape[n] != want:
                        raise UserError(f"hf.{n}", self._shape[n], f"config.json implies shape {want}")
                return ("experts", "per-expert", per_expert, which)
        fused = f"model.layers.{layer}.mlp.experts.{'down_proj' if which == 'w2' else 'gate_up_proj'}"
        if fused in self._shape:
            want = (E, D, F) if which == "w2" else (E, 2 * F, D)
            if self._shape[fused] != want:
                raise UserError(f"hf.{fused}", self._shape[fused], f"config.json implies shape {want}")
            return ("experts", "fused", [fused], which)
        return None

    def read(self, name: str, index: Index | None = None) -> torch.Tensor:
        """Tensor `name` (shoal's), or only its part `index`, as stored (the caller casts)."""
        index = index or tuple(slice(0, n) for n in self.expected[name])
        source = self._sources[name]
        if source[0] == "one":
            return self._slice(source[1], index)
        _, form, hf_names, which = source
        es, rows, cols = index  # w1/w3: [E, D, F]; w2: [E, F, D]
        if form == "per-expert":  # each expert's matrix is the transpose of shoal's slice of it
            return torch.stack([self._slice(hf_names[e], (cols, rows)).T for e in range(es.start, es.stop)])
        F = self.cfg.expert_hidden
        if which == "w2":  # down_proj [E, D, F]
            return self._slice(hf_names[0], (es, cols, rows)).transpose(1, 2)
        half = 0 if which == "w1" else F  # gate_up_proj [E, 2F, D]: the gate's F rows, then the up projection's
        return self._slice(hf_names[0], (es, slice(cols.start + half, cols.stop + half), rows)).transpose(1, 2)

    def _slice(self, hf_name: str, index: Index) -> torch.Tensor:
        with safe_open(str(self._where[hf_name]), framework="pt") as f:
            return f.get_slice(hf_name)[index]


def load_hf(directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Transformer:
    """A Hugging Face folder of a family hf_config.py lists as a shoal Transformer (eval mode; fp32 by
    default). Every tensor is checked against config.json before any is read, then copied one at a
    time into an unallocated-then-emptied model: peak memory is about one model, not two."""
    directory = Path(directory)
    cfg = hf_config_to_model_config(read_hf_config(directory))
    weights = HFWeights(directory, cfg)
    model = build_model(cfg, device="meta").to(dtype).to_empty(device=device)
    model.tie_weights()
    model.init_rope()  # a non-persistent buffer: to_empty left it garbage
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied: the output head is listed once, as the embedding
            p.copy_(weights.read(name))
    return model.eval()


def save_hf(model_or_state_dict: nn.Module | Mapping[str, torch.Tensor], cfg: ModelConfig, directory: str | Path,
            dtype: torch.dtype = torch.float32, *, bos_token_id: int | None = None,
            eos_token_id: int | None = None) -> Path:
    """Write config.json + model.safetensors of the Hugging Face family that computes `cfg`
    (hf_config.export_family), which transformers loads with from_pretrained. Takes a plain
    single-device model or its full (gathered, non-DTensor) state dict. Tied embeddings leave out
    lm_head.weight, as transformers writes it. Returns the directory."""
    family = export_family(cfg)  # refuses what no family computes before touching disk
    hf_config = model_config_to_hf_config(cfg, dtype=str(dtype).removeprefix("torch."), bos_token_id=bos_token_id,
                                          eos_token_id=eos_token_id)
    state = dict(model_or_state_dict.state_dict() if isinstance(model_or_state_dict, nn.Module) else model_or_state_dict)
    expected = {n: tuple(p.shape) for n, p in build_model(cfg, device="meta").named_parameters()}
    if cfg.tie_embeddings:
        state.pop("output.weight", None)  # the same tensor as the embedding; stored once
    unexpected, missing = set(state) - set(expected), set(expected) - set(state)
    if unexpected or missing:
        raise UserError("model_or_state_dict", f"{len(state)} tensors",
                        f"does not match the config: unexpected {_few(unexpected) or 'none'}; "
                        f"missing {_few(missing) or 'none'}")
    tensors = {}
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise UserError(f"model_or_state_dict.{name}", tuple(tensor.shape), f"the config implies {expected[name]}")
        tensor = tensor.detach().to(device="cpu", dtype=dtype)
        if m := _SHOAL_EXPERTS.fullmatch(name):
            pattern = _EXPERT_NAMES[family][m.group(2)]
            for e in range(tensor.shape[0]):
                tensors[f"model.layers.{m.group(1)}.{pattern.format(e=e)}.weight"] = tensor[e].T.contiguous()
        else:
            tensors[shoal_to_hf_name(name, family)] = tensor.contiguous()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / WEIGHTS), metadata={"format": "pt"})  # transformers wants the metadata
    (directory / CONFIG).write_text(json.dumps(hf_config, indent=2) + "\n")
    return directory
