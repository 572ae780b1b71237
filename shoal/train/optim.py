"""AdamW with decoupled weight decay on matrices only, a warmup + cosine schedule, and gradient
clipping that works on any layout."""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed as dist

from shoal.config import TrainConfig


class _SequentialNormReduce(logging.Filter):
    """Drops DTensor's "2 sequential all_reduce operations ... may give inconsistent results between
    ranks" warning, printed once per rank by every tp x dp run. Its source is clip_grad_norm below:
    the gradient norm is partial over dp_shard and tp and is summed one mesh dim at a time. That is
    benign here: every rank runs the same all-reduces in the same order and an all-reduce hands each
    member the same bits, so the ranks agree; the extra collective is one scalar's latency per step.
    Other redistribution warnings (all-gathers, reduce-scatters) still show."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "sequential all_reduce operations" not in record.getMessage()


logging.getLogger("torch.distributed.tensor._redistribute").addFilter(_SequentialNormReduce())


def build_optimizer(model, cfg: TrainConfig, rt=None, zero: int = 0) -> torch.optim.Optimizer:
    # Norm gains (1-D) are not decayed: shrinking them toward 0 only fights the normalization.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    if cfg.optimizer == "sgd":  # no state, so nothing for ZeRO-1 to shard
        return torch.optim.SGD(groups, lr=cfg.lr, foreach=False)
    kwargs = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=1e-8, **adamw_kernel(params))
    if zero == 1 and rt is not None and rt.dims.dp * rt.dims.cp > 1:  # cp ranks hold the same parameters
        from shoal.parallel.zero1 import ShardedAdamW

        return ShardedAdamW(groups, rt.mesh["dp_cp" if rt.dims.cp > 1 else "dp"].get_group(), **kwargs)
    return torch.optim.AdamW(groups, **kwargs)


def adamw_kernel(params: list[torch.Tensor]) -> dict:
    """Fused AdamW (one kernel for every tensor's update) when every parameter is on CUDA. Elsewhere
    foreach=False: the same per-tensor update whether tensors are plain, sharded or replicated."""
    if params and all(p.device.type == "cuda" for p in params):
        return {"fused": True}
    return {"foreach": False}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine to min_lr_ratio * lr."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, rt=None) -> float:
    """Clip the global gradient norm to max_norm (0: only measure it); returns the norm before clipping.

    Sharded gradients (DTensors) are reduced over their own mesh; pipeline stages hold disjoint
    parameters, so their squared norms are summed over the pipeline group.
    """
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    by_mesh: dict = {}
    for g in grads:
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    device = grads[0].device if grads else torch.device("cpu")
    total_sq = torch.zeros((), device=device)  # the default dtype: fp32, float64 under `shoal verify`
    for gs in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(gs, norm_type=2.0, foreach=False)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        total_sq += norm.to(total_sq.dtype) ** 2
    if rt is not None and rt.dims.pp > 1:
        dist.all_reduce(total_sq, group=rt.mesh["pp"].get_group())
    total = total_sq.sqrt()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=False)
    return float(total)
