"""Activation checkpointing per transformer block: none, selective or full.

full: a block keeps only its input; everything inside is recomputed in backward.
selective: the outputs of matmuls and of attention are kept; cheap element-wise work (norms,
activation functions, rotary embeddings) is recomputed. The wrapper strips its own prefix from
state-dict keys, so checkpoints keep the plain parameter names.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_KEEP = {
    torch.ops.aten.mm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEEP else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: torch.nn.Module, mode: str) -> None:
    if mode == "none":
        return
    for name, block in list(model.layers.items()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            context = partial(create_selective_checkpoint_contexts, _keep_matmuls)
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False, context_fn=context)
        model.layers[name] = wrapped
