"""The final model of a run as safetensors + a JSON config: what `shoal generate` loads.

Plain tensors only: loading never unpickles anything. (Sharded training checkpoints with
optimizer state are a separate format; see shoal/checkpoint/.)
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from safetensors.torch import load_model

from shoal.errors import UserError
from shoal.model.config import ModelConfig
from shoal.model.transformer import Transformer, build_model

WEIGHTS, CONFIG = "model.safetensors", "shoal_model.json"


def write_config(directory: Path, cfg: ModelConfig, tokenizer: str) -> None:
    """The JSON beside the weights (final_export.py writes the weights, one tensor at a time)."""
    (directory / CONFIG).write_text(json.dumps({"model": dataclasses.asdict(cfg), "tokenizer": tokenizer}, indent=1))


def find_model_dir(path: Path) -> Path:
    """Accept a run's output directory or the model directory inside it."""
    for candidate in (path, path / "model"):
        if (candidate / WEIGHTS).is_file() and (candidate / CONFIG).is_file():
            return candidate
    raise UserError("model_dir", str(path), f"holds no {WEIGHTS} + {CONFIG}; pass the --out directory of a finished `shoal train`")


def load_weights(path: Path, device: str = "cpu") -> tuple[Transformer, ModelConfig, str]:
    directory = find_model_dir(path)
    meta = json.loads((directory / CONFIG).read_text())
    cfg = ModelConfig(**meta["model"])
    model = build_model(cfg, device=device)
    load_model(model, str(directory / WEIGHTS), device=str(device))
    return model.eval(), cfg, meta["tokenizer"]
