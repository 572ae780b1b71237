"""The recipe: how one plain model becomes this rank's share of a parallel job. Read top to bottom."""

from __future__ import annotations

import torch
from torch import nn

from shoal.layout import compresses_in_hooks
from shoal.model.analytics import kv_heads_per_rank
from shoal.parallel.compression import build_compressor
from shoal.parallel.compression_fsdp import attach as attach_to_fsdp
from shoal.model.kernels import attention_backend
from shoal.model.precision import compute_dtype
from shoal.parallel.activation_checkpoint import apply_activation_checkpointing
from shoal.parallel.compile import apply_compile
from shoal.parallel.context_parallel import apply_context_parallel
from shoal.parallel.data_parallel import apply_ddp, apply_fsdp
from shoal.parallel.diloco import DiLoCo
from shoal.parallel.expert_parallel import apply_expert_parallel
from shoal.parallel.float8 import apply_float8
from shoal.parallel.mesh import ParallelDims
from shoal.parallel.parallel_model import ParallelModel, ScaledLoss, set_aux_loss_scale
from shoal.parallel.pipeline import build_schedule, split_model
from shoal.parallel.tensor_parallel import apply_tensor_parallel


def parallelize(model: nn.Module, job, mesh, expert_mesh, device: torch.device, loss_fn=None,
                weights=None) -> ParallelModel:
    """`model` is built on the meta device: the steps below only decide what this rank holds, and
    its share is allocated and initialized at the end (materialize): from train.seed, or read from
    `weights` (a pretrained folder's reader, shoal/checkpoint/pretrained.py).
    `job` is a shoal.job.Job: its layout says how to split, its config the rest."""
    lay, dims, train = job.layout, ParallelDims.of(job.layout), job.cfg.train
    # 1. Pipeline: keep only this rank's stages. Everything after this works per stage.
    ids, modules, n_stages, compressor = [0], [model], 1, None
    # Data parallelism within a replica group only, under DiLoCo: the groups meet in its outer step.
    # Context-parallel ranks hold the same parameters: gradients are reduced over dp x cp.
    dp, dp_axis = (dims.dp_shard, "dp_shard") if lay.diloco_inner_steps else (dims.dp * dims.cp, dp_cp(dims, "dp"))
    context = None
    if dims.pp > 1:
        n_stages = dims.pp * lay.virtual_stages
        ids, modules = split_model(model, mesh["pp"].get_local_rank(), dims.pp, lay.virtual_stages,
                                   lay.pp_schedule, job.cfg.parallel.pp_lighter_edges)
    # Parameters live on the host under FSDP2's CPU offload (it copies each block's share over when gathering).
    home = torch.device("cpu") if lay.offload == "params" else device
    for i, m in enumerate(modules):
        # 1b. FP8 (train.precision=fp8): the blocks' linear layers become torchao's Float8Linear before
        #     TP and FSDP see them; the weight stays an ordinary parameter of the same name.
        if train.precision == "fp8":
            apply_float8(m, train.fp8_recipe, device)
        # 2. Tensor parallel: turns weights into DTensors sharded over tp.
        if dims.tp > 1:
            apply_tensor_parallel(m, mesh["tp"], lay.sequence_parallel)
        # 2b. Context parallel: each rank holds two chunks of every sequence; attention all-gathers
        #     keys and values over cp (the layers' own, whatever tp did to their heads).
        if dims.cp > 1:
            context = apply_context_parallel(m, mesh["cp"], train.seq_len)
            loss_fn = context.loss  # the pipeline schedule's, and the step's below
        # 3. Expert parallel: each ep rank keeps n_experts/ep experts; tokens come by all-to-all.
        if dims.ep > 1:
            apply_expert_parallel(m, expert_mesh["ep"])
        # 4. Activation checkpointing wraps each block before data parallelism wraps it, so the
        #    recomputed forward sits inside the block's FSDP unit and re-gathers nothing extra.
        apply_activation_checkpointing(m, lay.activation_checkpoint)
        # 5. Compile each block after checkpointing wraps it (the recompute policy is traced into
        #    the block's graph) and before data parallelism does (FSDP's gathers stay outside the
        #    graph, between blocks, where they overlap compute), as torchtitan orders them.
        apply_compile(m, train.compile, tensor_parallel=dims.tp > 1, device_type=device.type)
        # 6. Data parallel last: it shards (or replicates) whatever the steps above produced.
        if dp > 1 and uses_ddp(dims, lay.zero):  # DDP wants real weights to start from
            m, group = materialize(m, device, train.seed, weights), mesh[dp_axis].get_group()
            compressor = build_compressor(lay.grad_compression, m, group, job.cfg.parallel, train.seed)
            modules[i] = apply_ddp(m, group, compressor)
        elif dp > 1:
            units = apply_fsdp(m, dp_mesh(mesh, dims, lay.zero, lay.diloco_inner_steps > 0, lay.grad_compression),
                               zero=data_parallel_zero(dims, lay.zero), precision=train.precision,
                               expert_mesh=expert_mesh["dp_mod_ep"] if dims.ep > 1 else None,
                               pipelined=dims.pp > 1,
                               grad_compression=lay.grad_compression, offload=lay.offload == "params",
                               pin_memory=device.type == "cuda")
            materialize(m, home, train.seed, weights)
            if compresses_in_hooks(lay.grad_compression):  # int8/topk/powersgd: across dp_replicate
                compressor = build_compressor(lay.grad_compression, m, mesh["dp_replicate"].get_group(),
                                              job.cfg.parallel, train.seed)
                attach_to_fsdp(units, compressor, int8_reduce_scatter=lay.grad_compression == "int8")
        else:
            modules[i] = materialize(m, device, train.seed, weights)
    wrapper = "none" if dp == 1 else "ddp" if uses_ddp(dims, lay.zero) else "fsdp"
    pm = ParallelModel(modules, device, train.precision, zero=data_parallel_zero(dims, lay.zero) if dp > 1 else 0,
                       wrapper=wrapper, vocab_parallel=dims.tp > 1, attention=_attention_kernel(job, dims, device),
                       context=context, activation_offload=lay.activation_offload)
    if context is not None:
        pm.loss = context.loss
    pm.grad_compressor = compressor
    if lay.diloco_inner_steps:
        pm.diloco = DiLoCo(modules, mesh["dp_replicate"].get_group(), job.cfg.parallel,
                           replica=mesh["dp_replicate"].get_local_rank())
    n_micro = job.n_microbatches
    set_aux_loss_scale(modules, 1.0 if dims.pp > 1 else 1.0 / n_micro)
    if dims.pp > 1:  # the loss the schedule differentiates carries fp16's loss scale (ParallelModel sets it)
        pm.scaled_loss = ScaledLoss(loss_fn)
        pm.schedule = build_schedule(modules, ids, n_stages, n_micro, pm.scaled_loss, lay.pp_schedule, device,
                                     mesh["pp"].get_group())
        pm.has_first_stage, pm.has_last_stage = 0 in ids, n_stages - 1 in ids
    return pm


def _attention_kernel(job, dims, device: torch.device) -> str:
    """The attention kernel this rank's heads run in the run's compute dtype (model/kernels.py)."""
    m = job.model
    return attention_backend(m.n_heads // dims.tp, kv_heads_per_rank(m, dims.tp), m.head_size, job.cfg.train.seq_len,
                             device, compute_dtype(job.cfg.train.precision))


def materialize(model: nn.Module, device: torch.device, seed: int, weights=None) -> nn.Module:
    """Allocate this rank's share of a meta-device model and fill it with the values the whole
    model would get from `seed` (init_weights draws each parameter by name, so shards and stages
    match one process exactly), or with the pretrained `weights`' (load_pretrained)."""
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gave the head its own copy; under FSDP, the one FSDP manages is the embedding's
    if weights is None:
        model.init_weights(seed, assign=assign_full_value)
    else:
        model.init_rope()
        load_pretrained(model, weights)
    return model


@torch.no_grad()
def load_pretrained(model: nn.Module, weights) -> None:
    """Each parameter this rank holds, read from `weights` by its name: only the block of the tensor
    this rank's shards cover, so a rank's memory is its share plus one block at most.

    The block is contiguous even under a strided shard: shoal's only strided shards are FSDP's, of a
    weight that tensor or expert parallelism already split along the same dimension: FSDP splits the
    local (contiguous) piece again; the strided placement only records that the two were applied out
    of mesh order. Any other placement reads the whole tensor, from which DTensor keeps this rank's part."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import _StridedShard

    from shoal.model.transformer import param_name

    for name, p in model.named_parameters():
        name = param_name(name)
        if not isinstance(p, DTensor):
            p.copy_(weights.read(name))
        elif all(type(placement) in (Shard, _StridedShard, Replicate) for placement in p.placements):
            shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
            index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
            if all(n > 0 for n in shape):  # an uneven shard can be empty on the last ranks
                p.to_local().copy_(weights.read(name, index))
        else:
            assign_full_value(p, weights.read(name).to(p.dtype))


def assign_full_value(p: torch.Tensor, value: torch.Tensor) -> None:
    """Copy a parameter's full value into it or, for a DTensor, into this rank's slice of it."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(p, DTensor):
        p.copy_(value)
        return
    # Replicate -> the parameter's placements (FSDP and TP shards, strided or not) only slices, locally.
    full = DTensor.from_local(value.to(p.device), p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
    p.to_local().copy_(full.redistribute(p.device_mesh, p.placements).to_local())


def data_parallel_zero(dims: ParallelDims, zero: int) -> int:
    """What the model wrapper shards: with nothing to shard across (dp_shard * cp == 1) ZeRO 2/3
    degenerate to replication, and ZeRO-1 shards only the optimizer (see optim.py)."""
    return 0 if dims.dp_shard * dims.cp == 1 or zero == 1 else zero


def dp_cp(dims: ParallelDims, axis: str) -> str:
    """The mesh axis gradients are reduced over: a data-parallel one, flattened with cp when cp > 1
    (torchtitan's dp_shard_cp: FSDP shards over the context-parallel ranks too)."""
    return f"{axis}_cp" if dims.cp > 1 else axis


def uses_ddp(dims: ParallelDims, zero: int) -> bool:
    """Replication (zero=0, and ZeRO-1's gradient half) of a model split no other way runs on DDP:
    its bucketed all-reduce beats per-block `replicate` (7% of a tiny model's step on gloo,
    bench/bench_vs_plain.py). Split models replicate through FSDP2, which understands DTensors and
    pipeline stages (DDP inside a GPipe stage trips an internal assert in its bucket rebuild)."""
    from shoal.layout import replicates_with_ddp

    return replicates_with_ddp(dims.dp_shard * dims.cp, zero, dims.tp, dims.pp, dims.ep)


def dp_mesh(mesh, dims: ParallelDims, zero: int, diloco: bool = False, grad_compression: str = "none"):
    """The mesh FSDP2 works on: 2-D (replicate, shard) for HSDP, else the one data-parallel axis;
    under DiLoCo, the replica group's own dp_shard ranks. A compressor that replaces HSDP's
    all-reduce also leaves FSDP2 the dp_shard axis alone."""
    if diloco:
        return mesh["dp_shard"]
    if data_parallel_zero(dims, zero) == 0:
        return mesh[dp_cp(dims, "dp")]
    if dims.dp_replicate > 1 and not compresses_in_hooks(grad_compression):  # not with cp (layout_rules.py)
        return mesh["dp_replicate", "dp_shard"]
    return mesh[dp_cp(dims, "dp_shard")]
