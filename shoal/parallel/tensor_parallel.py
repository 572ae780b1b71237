"""Tensor parallelism (Megatron-style) with sequence parallelism, as a DTensor plan.

The plan is data: module name -> ParallelStyle. Attention and MLP are column-parallel in,
row-parallel out (q/k/v biases are split with their columns), so each block needs one all-gather and
one reduce-scatter (with sequence parallelism) or two all-reduces (without). Between blocks the residual stream stays a plain local
tensor holding this rank's slice of the sequence [B, T/tp, D], which is also what pipeline stages
send each other. The output head is column-parallel over the vocabulary and stays a DTensor, so
the loss runs under `loss_parallel` and no rank ever holds full-vocabulary logits.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def block_plan(sequence_parallel: bool, qk_norm: bool = False) -> dict:
    residual = Shard(1) if sequence_parallel else Replicate()
    plan = {
        # The block input arrives as the local sequence slice; gather it for the attention matmuls.
        "attention": PrepareModuleInput(input_layouts=(residual, None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=residual),
        "feed_forward": PrepareModuleInput(input_layouts=(residual,), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=residual),
    }
    if sequence_parallel:
        plan["attention_norm"] = SequenceParallel(use_local_output=True)
        plan["ffn_norm"] = SequenceParallel(use_local_output=True)
    if qk_norm:
        # Each rank normalizes its own heads [B, T, H/tp, E] with the one weight all heads share: the
        # weight is a replicated DTensor and its gradient, a partial sum over this rank's heads, is
        # summed across the tp group (the style SequenceParallel gives any dimension, here the heads).
        plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard `model` (a whole model or one pipeline stage of it) across tp_mesh in place."""
    residual = Shard(1) if sequence_parallel else Replicate()
    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=residual)
    if model.norm is not None:
        top["norm"] = SequenceParallel(use_local_output=True) if sequence_parallel else None
        top["output"] = ColwiseParallel(input_layouts=residual, output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, {k: v for k, v in top.items() if v is not None})
    if model.cfg.tie_embeddings and model.tok_embeddings is not None and model.output is not None:
        # Each style swapped in its own new parameter; both are sharded over the vocabulary (Shard(0)),
        # so the head can take the embedding's again and the two stay one weight with one gradient.
        model.output.weight = model.tok_embeddings.weight
    for block in model.layers.values():
        plan = block_plan(sequence_parallel, block.attention.q_norm is not None)
        if block.feed_forward.w3 is None:  # GELU MLP: no up projection
            del plan["feed_forward.w3"]
        parallelize_module(block, tp_mesh, plan)
