"""Mixture-of-experts feed-forward: top-k token-choice router, grouped experts, shared experts.

Experts are held as stacked weights [n_experts, ...] so expert parallelism can shard dim 0.
The load-balancing loss does not travel through forward's return value (pipeline stages and
activation checkpointing would lose it): `AuxLossInjector` adds its gradient in backward, and the
detached value is kept in `last_aux_loss` for logging.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shoal.model.config import ModelConfig
from shoal.model.mlp import FeedForward  # shared experts are a plain MLP
from shoal.model.precision import upcast


class AuxLossInjector(torch.autograd.Function):
    """Identity on `out`; backward also sends d(scale * aux)/d(aux) = scale into the aux loss."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return grad_out, torch.full((), ctx.scale, device=grad_out.device), None


class GroupedExperts(nn.Module):
    """n_experts SwiGLU MLPs as stacked weights: w1, w3 [E, D, F] and w2 [E, F, D]."""

    def __init__(self, dim: int, hidden: int, n_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, dim))
        # Expert parallelism sets this to an all-to-all dispatch; it runs inside forward so that
        # wrappers hooked on this module (FSDP's parameter gathering) still run around it.
        self.dispatch = None

    def forward(self, x_ND: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """x_ND holds tokens sorted by expert; counts_E[e] of them go to expert e."""
        if self.dispatch is not None:
            return self.dispatch(self, x_ND, counts_E)
        return run_experts(self.w1, self.w2, self.w3, x_ND, counts_E.tolist())


def run_experts(w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, x_ND: torch.Tensor,
                tokens_per_expert: list[int]) -> torch.Tensor:
    """x_ND holds tokens sorted by expert; tokens_per_expert[e] of them go through expert e.

    The stacked weights are unbound once: indexing w1[e] per expert would make each expert's backward
    write a zero gradient the size of all experts and add it up, E times (on an H200, 76% of a
    128-expert layer's step went to those fills and adds); unbind's backward stacks the E gradients once."""
    outs = [(F.silu(x @ a) * (x @ c)) @ b for x, a, b, c in
            zip(torch.split(x_ND, tokens_per_expert), w1.unbind(0), w2.unbind(0), w3.unbind(0))]
    return torch.cat(outs) if outs else x_ND


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_experts, self.top_k, self.renormalize = cfg.n_experts, cfg.top_k, cfg.router_renormalize
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.experts = GroupedExperts(cfg.dim, cfg.expert_hidden, cfg.n_experts)
        self.shared = (FeedForward(cfg.dim, cfg.n_shared_experts * cfg.expert_hidden)
                       if cfg.n_shared_experts else None)
        self.aux_loss_coef = cfg.aux_loss_coef
        # What the main loss is multiplied by per micro-batch (1 / accumulation steps); the training
        # step sets it (ParallelModel) so the aux gradient is averaged the same way.
        self.aux_grad_scale = 1.0
        self.last_aux_loss = torch.zeros(())

    def route(self, x_ND: torch.Tensor):
        """Top-k experts per token, their weights (renormalized to sum to 1, unless the model does not),
        and the load-balancing loss."""
        probs_NE = F.softmax(upcast(self.router(x_ND)), dim=-1)
        weights_NK, experts_NK = probs_NE.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights_NK = weights_NK / weights_NK.sum(-1, keepdim=True)
        # Switch Transformer loss: E * sum_e (share of assignments to e) * (mean router prob of e).
        counts_E = torch.bincount(experts_NK.flatten(), minlength=self.n_experts)
        share_E = counts_E.float() / experts_NK.numel()
        aux = self.n_experts * (share_E * probs_NE.mean(0)).sum()
        return weights_NK, experts_NK, counts_E, aux

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        x_ND = x_BTD.reshape(-1, D)
        weights_NK, experts_NK, counts_E, aux = self.route(x_ND)
        # Sort the N*K (token, expert) assignments by expert so each expert sees one contiguous slice.
        order = experts_NK.flatten().argsort(stable=True)
        token_of = order // self.top_k
        x_sorted = x_ND[token_of]
        y_sorted = self.experts(x_sorted, counts_E)
        y_sorted = y_sorted * weights_NK.flatten()[order, None].to(y_sorted.dtype)
        y_ND = torch.zeros_like(x_ND).index_add_(0, token_of, y_sorted.to(x_ND.dtype))
        if self.shared is not None:
            y_ND = y_ND + self.shared(x_ND)
        self.last_aux_loss = aux.detach()
        if self.training and self.aux_loss_coef > 0 and torch.is_grad_enabled():
            y_ND = AuxLossInjector.apply(y_ND, aux * self.aux_loss_coef, self.aux_grad_scale)
        return y_ND.view(B, T, D)
