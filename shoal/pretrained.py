"""A pretrained model folder, what `model.init_from` names: a Hugging Face folder (config.json and
safetensors, sharded or not) or a shoal run's model/ (or the run folder holding it). Its model config
and tokenizer are read here, without torch, when the job config is resolved; the weights are read
later, by the ranks that hold them (shoal/checkpoint/pretrained.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from shoal.data.tokenizer_files import TOKENIZER
from shoal.errors import UserError, first_line
from shoal.model.config import ModelConfig
from shoal.model.hf_config import CONFIG as HF_CONFIG
from shoal.model.hf_config import hf_config_to_model_config, read_hf_config
from shoal.model.hf_shape import hf_config_to_shape
from shoal.rundir.names import MODEL, MODEL_CONFIG


@dataclass(frozen=True)
class Pretrained:
    folder: Path
    kind: str
    """'hf' or 'shoal'."""
    model: ModelConfig
    tokenizer: str | None
    """The tokenizer the model was trained with: the folder's tokenizer.json, or the spec a shoal
    model recorded ("byte", or a path); None when the folder names none."""


def open_pretrained(path: str, field: str = "model.init_from", shape_only: bool = False) -> Pretrained:
    """The model folder at `path`, or one UserError naming `field` and what is wrong with it. shape_only (for
    `shoal plan`): a Hugging Face config of any decoder family, read for its shape (model/hf_shape.py)."""
    folder = Path(path).expanduser()
    if folder.is_file():  # a model's config.json or weights, named instead of the folder holding them
        raise UserError(field, path, f"is a file; give the folder holding the model ({folder.parent})")
    if not folder.is_dir():
        raise UserError(field, path, "no such folder; give a Hugging Face model folder (config.json + "
                                     "*.safetensors) or a shoal run's model/")
    if (folder / MODEL / MODEL_CONFIG).is_file():  # a run's --out
        folder = folder / MODEL
    try:
        if (folder / MODEL_CONFIG).is_file():
            model, tokenizer = read_saved_model(folder)
            return Pretrained(folder, "shoal", model, tokenizer)
        if (folder / HF_CONFIG).is_file():
            local, hf = folder / TOKENIZER, read_hf_config(folder)
            model = (hf_config_to_shape if shape_only else hf_config_to_model_config)(hf)
            if model.is_mla and not shape_only:  # model_limits' fix, kv_lora_rank=0, is not the run's to make here
                raise UserError("hf.model_type", hf.get("model_type"), "a family with multi-head latent attention, "
                                "which shoal train does not compute (shoal plan --model plans it); start from a Llama, "
                                "Mistral or Qwen family model")
            return Pretrained(folder, "hf", model, str(local) if local.is_file() else None)
    except UserError as e:  # the folder's own field, said as the folder's
        raise UserError(field, path, f"{e.field}={e.value!r}: {e.fix}") from None
    raise UserError(field, path, f"holds neither {HF_CONFIG} (a Hugging Face model) nor {MODEL_CONFIG} (a shoal "
                                 "model); give the folder the weights are in")


def model_folder_of(path: str | Path) -> Path | None:
    """The model folder `path` is, or whose config file it is (a Hugging Face folder, a shoal model/ or
    the run holding one), else None: what model.init_from takes, where it was given as something else."""
    path = Path(path).expanduser()
    folder = path.parent if path.name in (HF_CONFIG, MODEL_CONFIG) and path.is_file() else path
    configs = (folder / HF_CONFIG, folder / MODEL_CONFIG, folder / MODEL / MODEL_CONFIG)
    return folder if folder.is_dir() and any(c.is_file() for c in configs) else None


def read_saved_model(folder: Path) -> tuple[ModelConfig, str]:
    """shoal_model.json: {"model": ModelConfig fields, "tokenizer": spec}, every field checked. A
    tokenizer.json copied into the folder is the tokenizer, wherever the run first found it."""
    path = folder / MODEL_CONFIG

    def damaged(reason: str) -> UserError:
        return UserError("model_dir", str(folder), f"is damaged ({reason}); train again or pass another run's --out")

    try:
        meta = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise damaged(f"{MODEL_CONFIG} is not readable JSON: {first_line(e)}") from None
    if not (isinstance(meta, dict) and isinstance(meta.get("model"), dict) and isinstance(meta.get("tokenizer"), str)):
        raise damaged(f'{MODEL_CONFIG} is not {{"model": {{...}}, "tokenizer": "..."}}')
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    if unknown := sorted(set(meta["model"]) - known):
        raise damaged(f"{MODEL_CONFIG} has unknown model fields {unknown[:3]}")
    try:
        model = ModelConfig(**meta["model"]).validate(prefix="model")
    except UserError as e:
        raise damaged(f"{MODEL_CONFIG}: {e}") from None
    copied = folder / TOKENIZER
    tokenizer = str(copied) if copied.is_file() else meta["tokenizer"]
    if tokenizer != "byte" and not Path(tokenizer).expanduser().exists():  # else named as data.tokenizer, unasked
        raise damaged(f"{MODEL_CONFIG} names the tokenizer {tokenizer!r:.80}, which is not there, nor a {TOKENIZER} "
                      "beside it")
    return model, tokenizer


SHAPE_SET_BY_THE_FOLDER = tuple(f.name for f in dataclasses.fields(ModelConfig)
                                if f.name not in ("max_seq_len", "aux_loss_coef", "note"))
"""What model.init_from decides (the shape and the math of the weights it holds); a recipe may still
set the context trained on (max_seq_len) and the load-balancing loss's weight."""


def model_of(pretrained: Pretrained, overrides: dict) -> ModelConfig:
    """The folder's model with the overrides a run may make; any other field given must agree with it."""
    for name, value in overrides.items():
        if name in SHAPE_SET_BY_THE_FOLDER and value != getattr(pretrained.model, name):
            raise UserError(f"model.{name}", value, f"model.init_from={pretrained.folder} has {name}="
                                                    f"{getattr(pretrained.model, name)!r}: the folder's weights "
                                                    "decide it; leave it out")
    return pretrained.model.replace(**overrides).validate(base=pretrained.model)  # a dense folder: no MoE-only fields


def take_the_folder(cfg, given) -> None:
    """What model.init_from decides in a job config (`cfg`, a JobConfig), against the keys `given`
    beside it or after it: a preset is refused (the folder is the model), shape fields must agree
    (model_of, when the model is resolved), and the tokenizer is the folder's unless data.tokenizer
    is given, never one with more tokens than the model's vocabulary."""
    from shoal.data.tokenizer import load_tokenizer

    folder = cfg.model.init_from
    if "model.preset" in given:
        raise UserError("model.preset", cfg.model.preset, f"model.init_from={folder} is the model (its shape and "
                                                          "weights); leave model.preset out")
    pretrained = open_pretrained(folder)
    if "data.tokenizer" not in given:
        if not pretrained.tokenizer:
            raise UserError("model.init_from", folder, f"holds no tokenizer.json{_sentencepiece_only(folder)}: give "
                            "the tokenizer the model was trained with (data.tokenizer=PATH/tokenizer.json), or "
                            "data.tokenizer=byte")
        cfg.data.tokenizer = pretrained.tokenizer
    # A folder's context may be shorter than the defaults' sequence and sample (small test models: 64-128
    # positions): train on, and sample, its whole context then, as Hugging Face's run_clm takes
    # min(1024, model_max_length).
    context = cfg.model.max_seq_len if "model.max_seq_len" in given else pretrained.model.max_seq_len
    for name in ("seq_len", "sample_tokens"):
        if f"train.{name}" not in given:
            setattr(cfg.train, name, min(getattr(cfg.train, name), context))
    if (n := load_tokenizer(cfg.data.tokenizer).vocab_size) > pretrained.model.vocab_size:
        raise UserError("data.tokenizer", cfg.data.tokenizer, f"has {n} tokens but model.init_from's model has "
                        f"vocab_size={pretrained.model.vocab_size}; give the tokenizer it was trained with")


def _sentencepiece_only(folder: str) -> str:
    """What to do about a folder whose tokenizer is only a sentencepiece model (older Llama and Mistral
    releases), which shoal does not read: transformers converts it into a tokenizer.json."""
    if not (Path(folder).expanduser() / "tokenizer.model").is_file():
        return ""
    return (" (its tokenizer.model is a sentencepiece file, which shoal does not read; transformers writes "
            "the tokenizer.json: AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER))")
