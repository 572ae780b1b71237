"""Expert parallelism: each rank of an ep group holds n_experts/ep experts; tokens travel by all-to-all.

Per MoE layer and micro-batch: (1) exchange how many tokens each rank sends to each expert,
(2) all-to-all the tokens (uneven splits), (3) regroup what arrived by local expert and run the
experts, (4) undo the regrouping and all-to-all the results back. The all-to-alls are the
autograd-aware functional collectives, so backward runs the same exchange in reverse.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single, all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from shoal.model.moe import MoE, run_experts


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by `scale` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class AllToAllDispatch:
    """GroupedExperts.dispatch for one ep group."""

    def __init__(self, ep_mesh: DeviceMesh):
        self.group = ep_mesh.get_group()
        self.ep = ep_mesh.size()

    def __call__(self, experts: nn.Module, x_sorted: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        ep, n_local = self.ep, counts_E.numel() // self.ep
        # counts_E[j * n_local + e]: my tokens for expert e of rank j. Learn what the others send me.
        recv_counts = all_to_all_single(counts_E, None, None, self.group).wait().view(ep, n_local)
        send_splits = counts_E.view(ep, n_local).sum(1).tolist()
        recv_splits = recv_counts.sum(1).tolist()
        x_recv = all_to_all_single_autograd(x_sorted, recv_splits, send_splits, self.group)
        # Arrived grouped by source rank, then expert; the experts want them grouped by expert.
        expert_of = torch.arange(n_local, device=x_recv.device).repeat(ep).repeat_interleave(recv_counts.flatten())
        order = expert_of.argsort(stable=True)
        # An expert's gradient sums the tokens of all ep ranks; data parallelism then averages it over
        # the dp/ep ranks holding the same expert. Scaling by 1/ep makes that the mean over all dp ranks.
        weights = [_ScaleGrad.apply(w.to_local() if isinstance(w, DTensor) else w, 1.0 / ep)
                   for w in (experts.w1, experts.w2, experts.w3)]
        y_grouped = run_experts(*weights, x_recv[order], recv_counts.sum(0).tolist())
        y_recv = torch.empty_like(y_grouped).index_copy(0, order, y_grouped)
        return all_to_all_single_autograd(y_recv, send_splits, recv_splits, self.group)


def apply_expert_parallel(model: nn.Module, ep_mesh: DeviceMesh) -> None:
    """Shard every MoE layer's experts along dim 0 over ep_mesh and route tokens by all-to-all."""
    dispatch = AllToAllDispatch(ep_mesh)
    for module in model.modules():
        if isinstance(module, MoE):
            experts = module.experts
            for name, param in list(experts.named_parameters(recurse=False)):
                sharded = distribute_tensor(param.detach(), ep_mesh, [Shard(0)], src_data_rank=None)
                experts.register_parameter(name, nn.Parameter(sharded, requires_grad=param.requires_grad))
            experts.dispatch = dispatch


