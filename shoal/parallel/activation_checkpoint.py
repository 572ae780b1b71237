"""Activation checkpointing per transformer block: none, selective, selective-op or full.

full: a block keeps only its input; everything inside is recomputed in backward.
selective: the outputs of matmuls and of attention are kept; cheap element-wise work (norms,
activation functions, rotary embeddings) is recomputed.
selective-op: torchtitan's per-op policy (torchtitan/models/llama3/infra/parallelize.py,
`selective_ac_option = "op"`): selective, except that the output of every second matmul of a block
(in call order: wk, wo, w3 of a Llama block) is recomputed as well, trading a third of the MLP's and
some of attention's forward GEMMs for their outputs' memory.
The wrapper strips its own prefix from state-dict keys, so checkpoints keep the plain parameter names.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_MATMUL = torch.ops.aten.mm.default
_KEEP = {
    _MATMUL,
    torch.ops.aten.bmm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _KEEP else CheckpointPolicy.PREFER_RECOMPUTE


def _every_other_matmul() -> tuple:
    """The selective-op policy pair for one checkpointed call of a block. The forward and its
    recomputation count their matmuls apart, so the recomputation sees the same odd/even pattern."""
    seen: Counter[bool] = Counter()

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op == _MATMUL:
            seen[ctx.is_recompute] += 1
            if seen[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return _keep_matmuls(ctx, op)

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(model: torch.nn.Module, mode: str) -> None:
    if mode == "none":
        return
    for name, block in list(model.layers.items()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            context = _every_other_matmul if mode == "selective-op" else partial(create_selective_checkpoint_contexts,
                                                                                 _keep_matmuls)
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False, context_fn=context)
        model.layers[name] = wrapped
