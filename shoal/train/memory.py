"""What this rank holds: bytes of model state (parameters, gradients, optimizer state), by local shard."""

from __future__ import annotations

import torch


def model_state_bytes(params, optimizer) -> int:
    """Bytes of parameters, gradients and optimizer state this rank actually holds (local shards)."""
    from torch.distributed.tensor import DTensor

    def size(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    total = 0
    for p in params:
        total += size(p)
        if p.grad is not None:
            total += size(p.grad)
    for state in optimizer.state.values():  # under zero=1 only this rank's share has state
        total += sum(size(v) for v in state.values() if isinstance(v, torch.Tensor) and v.ndim > 0)
    return total
