"""train.precision=fp8: the transformer blocks' linear layers multiply in float8 (torchao's float8 training).

Each nn.Linear inside a block becomes torchao's Float8Linear: its forward and its two backward matmuls
cast both operands to float8 (e4m3 in forward; e5m2 for the gradient in the tensorwise recipe) with
scales computed on the fly from each tensor's (or each row's, `rowwise`) largest magnitude, multiply
with torch._scaled_mm, and return bf16 under autocast. Everything else is the bf16 recipe: fp32 master
weights and AdamW state, autocast bf16 for attention, norms in fp32, and the output head and the MoE
router kept out of FP8 (the head's logits and the router's choices are where FP8's 3 mantissa bits
hurt most; torchtitan leaves the head out too). Routed MoE experts are grouped matmuls, not
nn.Linear, so they stay bf16.

On a device without FP8 matrix units (CPU here) torchao's `emulate` does the same casts and scales
and multiplies the dequantized values, so CI runs the recipe's numerics; a GPU without FP8 tensor
cores is refused before the job starts (launch/session.py), never trained silently in bf16.

Converted before tensor parallelism and FSDP wrap the model (torchtitan's order): the Float8Linear
keeps its weight as an ordinary fp32 parameter under the same name, so initialization by name,
FSDP sharding and checkpoints are unchanged.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

SKIPPED = ("output", "router")
"""Linear layers left out of FP8 (by their last name): the output head and the MoE router."""


def _torchao_float8():
    """torchao.float8, imported without the warnings per rank that its CUDA kernels' libraries do not
    load into a CPU build of torch (float8 training does not use them) and that torch deprecates how
    it registers an enum."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        import torchao.float8
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
    return torchao.float8


def fp8_config(recipe: str, device_type: str):
    """torchao's Float8LinearConfig for `recipe` (tensorwise | rowwise), emulated off CUDA."""
    Float8LinearConfig = _torchao_float8().Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(recipe)
    return dataclasses.replace(config, emulate=device_type != "cuda")


def apply_float8(model: nn.Module, recipe: str, device: torch.device) -> int:
    """Swap the blocks' nn.Linear layers for Float8Linear in place; returns how many were swapped.
    A device that can neither multiply in FP8 nor emulate it is refused (normally before the job
    starts; this catches launches that skip that check)."""
    from shoal.errors import UserError

    if problem := fp8_device_problem(device):
        raise UserError("train.precision", "fp8", problem)

    def wanted(module: nn.Module, fqn: str) -> bool:
        return isinstance(module, nn.Linear) and fqn.split(".")[-1] not in SKIPPED and fqn.startswith("layers.")

    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    _torchao_float8().convert_to_float8_training(model, config=fp8_config(recipe, device.type), module_filter_fn=wanted)
    after = sum(type(m) is nn.Linear for m in model.modules())
    return before - after


def fp8_device_problem(device: torch.device) -> str | None:
    """Why this device cannot run train.precision=fp8, or None. CPU emulates; CUDA needs FP8 tensor
    cores (compute capability 8.9: Ada, Hopper and later)."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= (8, 9):
        return None
    return (f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no FP8 tensor cores "
            "(8.9 or newer: Ada, Hopper, Blackwell); use train.precision=bf16 (or fp16 on GPUs without bf16)")
