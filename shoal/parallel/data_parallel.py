"""Data parallelism by ZeRO stage, on PyTorch's own wrappers.

zero=0  every rank holds everything; gradients all-reduced: DDP when data parallelism is the only
        split, else FSDP2's `replicate`, which composes with tensor-parallel DTensors and stages.
zero=1  optimizer state sharded: gradients all-reduced as for zero=0, and each rank keeps AdamW
        state for its share of the parameters, then broadcasts the ones it updated (zero1.py).
zero=2  + gradients sharded: FSDP2 `fully_shard` that keeps parameters gathered from forward
        through backward (reshard_after_forward=False) and reduce-scatters gradients.
zero=3  + parameters sharded: FSDP2 `fully_shard`, parameters re-gathered for backward.
With dp_replicate > 1 and dp_shard > 1 (zero 2/3), FSDP2 shards within dp_shard and all-reduces
across dp_replicate (HSDP); with int8/topk/powersgd it shards within dp_shard only and the
compressor all-reduces across dp_replicate (compression_fsdp.py). Each transformer block is its own FSDP unit, so its gradient
reduction overlaps the backward of the blocks before it, and FSDP2 prefetches the next block's
parameters during forward and backward (its default: one block ahead).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """bf16 leaves parameters fp32 and lets autocast choose each op's dtype, as on 1 process and DDP, so
    every layout computes the same thing. bf16-params (torchtitan's default) gathers bf16 copies instead:
    half the all-gather bytes, but the embedding, norms and head then compute in bf16 too. Gradients
    are reduced in fp32 either way, so averaging is exact."""
    if precision == "bf16-params":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def expert_modules(model: nn.Module) -> list[nn.Module]:
    return [block.feed_forward.experts for block in model.layers.values()
            if getattr(block.feed_forward, "experts", None) is not None]


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, *, zero: int, precision: str,
               expert_mesh: DeviceMesh | None = None, pipelined: bool = False,
               grad_compression: str = "none", offload: bool = False, pin_memory: bool = False) -> list[nn.Module]:
    """zero=2/3 (and zero=0 through `replicate`) on one model or pipeline stage, block by block;
    returns the wrapped modules (FSDP's units), experts and blocks first, the model last.

    pipelined: the model is a pipeline stage. Parameters then stay gathered from their first forward
    until the step's gradient reduction, as under zero=2: PyTorch's stages run every micro-batch's
    backward with FSDP2's re-shard after backward off and reduce once after the last (pipelining/
    stage.py), so each layer is gathered again after its backward anyway, and re-sharding after each
    forward would only add an all-gather per micro-batch (torchtitan keeps them gathered under a
    pipeline for the same reason). Zero-bubble needs it besides: it computes weight gradients after
    later micro-batches' forwards, and re-sharding in between loses them (found by `shoal verify`:
    pp2 x dp_shard2 zero=3 was off by 0.35 in loss).

    Expert weights sharded by expert parallelism are wrapped on their own mesh: the data-parallel
    ranks that hold the same experts (see expert_parallel.py for how their gradients are scaled).

    offload (parallel.offload=params, zero 2/3 only: shoal/layout_rules.py): FSDP2's CPUOffloadPolicy keeps
    the sharded parameters and gradients in host memory (pinned on CUDA), copies a block's share to the
    device when it gathers it and the reduced gradient back, so the optimizer steps on the host.
    """
    mp = mixed_precision(precision)
    if grad_compression == "bf16":  # the only compression FSDP2 can do: reduce(-scatter) in bf16
        mp = dataclasses.replace(mp, reduce_dtype=torch.bfloat16)
    if zero == 0:
        from torch.distributed._composable.replicate_with_fsdp import replicate as wrap

        kwargs = {"mp_policy": mp}
    else:
        wrap = fully_shard
        kwargs = {"mp_policy": mp, "reshard_after_forward": zero == 3 and not pipelined,
                  "offload_policy": CPUOffloadPolicy(pin_memory=pin_memory) if offload else OffloadPolicy()}
    units = []
    for experts in expert_modules(model) if expert_mesh is not None else []:
        units.append(wrap(experts, mesh=expert_mesh, **kwargs))
    for block in model.layers.values():
        units.append(wrap(block, mesh=mesh, **kwargs))
    units.append(wrap(model, mesh=mesh, **kwargs))
    return units


def apply_ddp(model: nn.Module, dp_group, compressor=None) -> nn.Module:
    """Bucketed gradient all-reduce overlapping backward (25 MB buckets), for zero=0 and zero=1.

    torch's default all-reduce hook, registered explicitly, does what DDP's built-in C++ one does but
    issues the all-reduce from Python, where shoal's byte counter and hang watchdog see it.
    A compressor (parallel/compression.py) replaces it with a compressed reduction.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from shoal.comm.renamed import ddp_without_buffer_sync

    ddp = DistributedDataParallel(model, process_group=dp_group, bucket_cap_mb=25, gradient_as_bucket_view=True,
                                  **ddp_without_buffer_sync())
    if compressor is not None:
        ddp.register_comm_hook(state=compressor, hook=type(compressor).hook)
    else:
        ddp.register_comm_hook(state=dp_group, hook=default_hooks.allreduce_hook)
    return ddp

