"""Tensor parallelism (Megatron-style) with sequence parallelism, as a DTensor plan.

The plan is data: module name -> ParallelStyle. Attention and MLP are column-parallel in,
row-parallel out (q/k/v biases are split with their columns), so each block needs one all-gather and
one reduce-scatter (with sequence parallelism) or two all-reduces (without). Between blocks the residual stream stays a plain local
tensor holding this rank's slice of the sequence [B, T/tp, D], which is also what pipeline stages
send each other. The output head is column-parallel over the vocabulary and stays a DTensor, so
the loss runs under `loss_parallel` and no rank ever holds full-vocabulary logits.

With more ranks than key/value heads (tp > n_kv_heads, which it then divides), the k/v projections
are replicated instead of split (ReplicatedKVHeads): each rank computes the one kv head its query
heads read.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle


class ReplicatedKVHeads(ParallelStyle):
    """A k or v projection when tp exceeds the kv heads: its weight (and bias) is replicated, and each
    rank computes only the head its query heads read, head rank // (tp / n_kv_heads) (tp divides the
    query heads, and the kv heads divide tp, so a rank's query heads never straddle two kv heads).

    The weight's gradient on a rank covers its head alone, and the input's covers only what its own
    query heads asked of it: both are partial sums over the tp group, as a column-parallel layer's
    input gradient is, and are marked Partial so DTensor (or FSDP) sums them. Every rank keeps all
    kv heads' weights, so checkpoints, clipping and export see the plain weight; FSDP shards it over
    the data-parallel ranks. (Megatron instead keeps one head per rank and all-reduces its gradient
    within the ranks sharing it.)"""

    def __init__(self, n_kv_heads: int, head_size: int):
        super().__init__()
        self.n_kv_heads, self.head_size = n_kv_heads, head_size

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp = device_mesh.size()
        head = device_mesh.get_local_rank() // (tp // self.n_kv_heads)
        rows = slice(head * self.head_size, (head + 1) * self.head_size)
        for name, p in list(module.named_parameters(recurse=False)):
            replicated = distribute_tensor(p.data, device_mesh, [Replicate()], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(replicated, requires_grad=p.requires_grad))

        def forward(x: DTensor):
            x = x.to_local(grad_placements=[Partial()])  # the block's input, replicated by PrepareModuleInput
            bias = module.bias.to_local(grad_placements=[Partial()])[rows] if module.bias is not None else None
            return F.linear(x, module.weight.to_local(grad_placements=[Partial()])[rows], bias)

        module.forward = forward
        return module


def block_plan(sequence_parallel: bool, qk_norm: bool = False, kv_heads_per_rank: tuple[int, int] | None = None) -> dict:
    """The plan of one block; `kv_heads_per_rank`: (n_kv_heads, head_size) where tp exceeds the kv heads."""
    residual = Shard(1) if sequence_parallel else Replicate()
    kv = ReplicatedKVHeads(*kv_heads_per_rank) if kv_heads_per_rank else None
    plan = {
        # The block input arrives as the local sequence slice; gather it for the attention matmuls.
        "attention": PrepareModuleInput(input_layouts=(residual, None, None),  # x, rope, document mask
                                       desired_input_layouts=(Replicate(), None, None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": kv or ColwiseParallel(),
        "attention.wv": kv or ColwiseParallel(),
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
    model.tie_weights()  # both styles shard the weight over the vocabulary (Shard(0)): it stays one
    cfg = model.cfg
    replicated_kv = (cfg.n_kv_heads, cfg.head_size) if tp_mesh.size() > cfg.n_kv_heads else None
    for block in model.layers.values():
        plan = block_plan(sequence_parallel, block.attention.q_norm is not None, replicated_kv)
        if block.feed_forward.w3 is None:  # GELU MLP: no up projection
            del plan["feed_forward.w3"]
        parallelize_module(block, tp_mesh, plan)
