"""fp16's dynamic loss scaling: gradients too small for float16 are lifted into its range, and a step
whose gradients overflowed anyway is skipped on every rank alike.

float16 keeps 10 mantissa bits but only 5 exponent bits: values under 6e-8 flush to zero and over
65504 become inf. Backward multiplies from the loss down, so many activation gradients are tiny; the
loss is multiplied by `scale` (a power of two) before backward and every gradient divided by it after,
both exact in binary floating point. The scale is dynamic, as torch.amp.GradScaler's:
- a step whose gradients hold an inf or NaN anywhere is skipped (no update) and the scale halved;
- after `window` steps in a row without one the scale doubles, to stay as high as fits.

Sharded-aware: under FSDP/HSDP each rank holds only its shard of the gradients, and a pipeline stage
only its own layers, so one rank's "all finite" says nothing of the others'. The verdict is one
all-reduce (MAX of a 0/1 flag) over the whole world: every rank skips or steps together, and the
scale stays the same number everywhere (it is part of the checkpoint's train_state.json, so a resumed
run continues with the same scale: bitwise).

debug.overflow_steps makes chosen steps' gradients inf on rank 0 after backward (as a real overflow
on one shard would), so the skip path is tested on purpose.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

BACKOFF, GROWTH = 0.5, 2.0


class LossScaler:
    def __init__(self, init: float = 2.0**16, window: int = 2000, force_overflow: tuple[int, int] | None = None,
                 rank: int = 0, world_size: int = 1):
        self.scale, self.window, self.good, self.skipped = float(init), window, 0, 0
        self.force_overflow, self.rank, self.world_size = force_overflow, rank, world_size

    def unscale(self, params, step: int) -> bool:
        """Divide every gradient by the scale; True when they are all finite on every rank (collective)."""
        grads = [_local(p.grad) for p in params if p.grad is not None]
        forced = self.force_overflow is not None and self.force_overflow[0] <= step <= self.force_overflow[1]
        if forced and self.rank == 0 and grads:
            grads[0].fill_(float("inf"))
        bad = torch.zeros(1, dtype=torch.float32, device=grads[0].device if grads else "cpu")
        by_device: dict = {}
        for g in grads:  # offloaded (host) and device gradients apart: torch's kernel takes one device's
            by_device.setdefault(g.device, []).append(g)
        for device, gs in by_device.items():  # GradScaler's fused multiply-and-check, one launch per device
            found = torch.zeros(1, dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, found, torch.full((1,), 1.0 / self.scale, device=device))
            bad = torch.maximum(bad, found.to(bad.device))
        if self.world_size > 1:  # one rank's shard overflowing skips the step everywhere
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return not bool(bad)

    def update(self, finite: bool) -> None:
        """After the step: halve the scale on overflow (the step was skipped), double it after a window."""
        if not finite:
            self.scale, self.good, self.skipped = self.scale * BACKOFF, 0, self.skipped + 1
            return
        self.good += 1
        if self.good >= self.window:
            self.scale, self.good = self.scale * GROWTH, 0

    def metrics(self) -> dict:
        return {"loss_scale": self.scale, "skipped_steps": self.skipped}

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good": self.good, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good, self.skipped = float(state["scale"]), int(state["good"]), int(state["skipped"])


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def build_scaler(job, rt) -> LossScaler | None:
    """The run's loss scaler: fp16 only (bf16's range is fp32's; fp8's scales are torchao's, per tensor)."""
    t = job.cfg.train
    if t.precision != "fp16":
        return None
    from shoal.rundir.observability import profile_step_range

    return LossScaler(t.loss_scale, t.loss_scale_window, profile_step_range(job.cfg.debug.overflow_steps),
                      rt.rank, rt.world_size)
