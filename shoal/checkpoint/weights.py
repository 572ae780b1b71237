"""The final model of a run as safetensors + a JSON config: what `shoal generate` loads.

Plain tensors only: loading never unpickles anything. (Sharded training checkpoints with
optimizer state are a separate format; see shoal/checkpoint/.)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_model

from shoal.errors import UserError, first_line
from shoal.model.config import ModelConfig
from shoal.model.transformer import Transformer, build_model
from shoal.data.tokenizer_files import copy_tokenizer
from shoal.pretrained import read_saved_model
from shoal.rundir.names import MODEL, MODEL_CONFIG as CONFIG, MODEL_WEIGHTS as WEIGHTS


def write_config(directory: Path, cfg: ModelConfig, tokenizer: str) -> None:
    """The JSON beside the weights (final_export.py writes the weights, one tensor at a time), and the
    tokenizer's files (data/tokenizer_files.py)."""
    tokenizer = copy_tokenizer(tokenizer, directory)
    (directory / CONFIG).write_text(json.dumps({"model": dataclasses.asdict(cfg), "tokenizer": tokenizer}, indent=1))


def find_model_dir(path: Path) -> Path:
    """Accept a run's output directory or the model directory inside it."""
    for candidate in (path, path / MODEL):
        if (candidate / WEIGHTS).is_file() and (candidate / CONFIG).is_file():
            return candidate
    raise UserError("model_dir", str(path), f"holds no {WEIGHTS} + {CONFIG}; pass the --out directory of a finished `shoal train`")


def load_weights(path: Path, device: str = "cpu") -> tuple[Transformer, ModelConfig, str]:
    """The model saved in a run directory; a damaged one is a UserError saying what is wrong."""
    directory = find_model_dir(path)

    def damaged(reason: str) -> UserError:
        return UserError("model_dir", str(path), f"is damaged ({reason}); train again or pass another run's --out")

    cfg, tokenizer = read_saved_model(directory)
    model = build_model(cfg, device="meta")  # shapes only: compared with the file before allocating anything
    expected = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    try:
        with safe_open(str(directory / WEIGHTS), framework="pt") as f:
            stored = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a truncated or garbled file
        raise damaged(f"{WEIGHTS} cannot be read: {first_line(e)}") from None
    wrong = [n for n, shape in stored.items() if n in expected and expected[n] != shape]
    tied = {"tok_embeddings.weight", "output.weight"} if cfg.tie_embeddings else set()
    missing = [n for n in expected if n not in stored and not (n in tied and tied & stored.keys())]
    if wrong or missing:
        n = (wrong or missing)[0]
        raise damaged(f"{WEIGHTS} has {n} as {stored.get(n, 'missing')}, {CONFIG} says {expected[n]}")
    model = build_model(cfg, device=device)
    try:
        load_model(model, str(directory / WEIGHTS), device=str(device))
    except Exception as e:
        raise damaged(f"{WEIGHTS} cannot be loaded: {first_line(e)}") from None
    if name := first_nonfinite(model.named_parameters()):
        raise damaged(f"{WEIGHTS} holds nan or inf in {name}")
    return model.eval(), cfg, tokenizer


def first_nonfinite(named) -> str | None:
    """The first of (name, tensor) pairs holding NaN or infinity: flipped bytes in stored weights show up so,
    or not at all (a model folder's, and a checkpoint's once export has read it)."""
    return next((name for name, t in named if t.is_floating_point() and not torch.isfinite(t).all()), None)
