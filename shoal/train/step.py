"""One optimizer step: the work every rank does between two batches, and what it measured.

The order inside a step, and why:
1. Replica groups meet first: a group that is behind (restarted) takes a live peer's state and
   step here, so the step runs on the live state (shoal/train/replicas.py).
2. Forward and backward of the step's micro-batches, then the gradients' sync across replica
   groups and the clip: everything the step sends is counted, ZeRO-1's parameter broadcast in
   optimizer.step included.
3. The replica groups agree the step went through; if a peer died mid-step nobody steps and the
   step is done again (the loader rewinds to the same batch).
4. fp16's loss scaler (loss_scale.py) divides the gradients by the scale after the replica sync and
   before the clip; an overflow on any rank skips the update everywhere and halves the scale.
   Otherwise the NaN/Inf guard decides, on numbers equal on every rank, whether the update happens;
   DiLoCo's outer step follows its inner step.
A feature that acts inside a step adds its line here, in that order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from shoal.comm.counter import CommCounter
from shoal.parallel.compression import wire_fields
from shoal.train.distributed import group_labels, mark, rank_stats
from shoal.train.memory import RankMemory, model_state
from shoal.train.optim import clip_grad_norm, lr_at, set_lr


@dataclass(frozen=True)
class StepDone:
    step: int
    """The optimizer steps done now (1-based: the step just taken)."""
    loss: float
    """The step's loss, averaged over data-parallel ranks (equal on every rank)."""
    grad_norm: float
    lr: float
    seconds: float


class TrainStep:
    """Takes the run's steps one at a time (`done` counts them) and builds each one's metrics row."""

    def __init__(self, job, rt, pm, optimizer, loader, replicas, guard, *, start: int, step_flops: float,
                 peak_flops: float, plan=None):
        self.job, self.t, self.rt, self.pm, self.optimizer, self.loader = job, job.cfg.train, rt, pm, optimizer, loader
        self.replicas, self.guard, self.plan, self.scaler = replicas, guard, plan, pm.loss_scaler
        self.done, self.step_flops, self.peak_flops = start, step_flops, peak_flops
        self.tokens_per_step = self.t.global_batch * self.t.seq_len
        self.tokens = start * self.tokens_per_step
        self.counter = CommCounter(group_labels(rt))
        self.memory = RankMemory(pm.parameters(), rt.device, measure_activations=not self.t.compile)

    def __call__(self) -> StepDone | None:
        """The next step on every rank; None when a replica group died mid-step and nobody stepped
        (the caller calls again: the same step, with the groups still alive)."""
        t, t0 = self.t, time.perf_counter()
        self.done = self.replicas.start_step(self.done)  # a rejoining replica group takes the live step here
        step, lr = self.done + 1, lr_at(self.done, t)
        mark(step, "train")
        set_lr(self.optimizer, lr)
        self.counter.reset()
        with self.counter:
            with self.memory.measure_first_step():
                loss = self.pm.forward_backward(self.loader.next_step(), self.scaler.scale if self.scaler else 1.0)
            self.replicas.average_grads(self.pm.parameters())
            finite = self.scaler is None or self.scaler.unscale(self.pm.parameters(), step)  # the same on every rank
            grad_norm = clip_grad_norm(list(self.pm.parameters()), t.grad_clip, self.rt) if finite else math.inf
        loss = self.rt.global_mean(loss)  # for the log, not the step's traffic; equal on every rank, so the
        #                                   guard below decides alike everywhere
        if not self.replicas.should_commit():
            self.optimizer.zero_grad(set_to_none=True)
            return None
        with self.counter:
            if self._may_update(step, loss, grad_norm, finite):
                self.optimizer.step()
            if self.pm.diloco is not None:  # DiLoCo's outer step, every diloco_inner_steps (or per fragment)
                self.pm.diloco.after_step(step, last=step == t.steps)
        self._state = model_state(self.pm.parameters(), self.optimizer, self.pm.slow_link_state())  # AdamW's exists now
        self.optimizer.zero_grad(set_to_none=True)
        self.done, self.tokens = step, self.tokens + self.tokens_per_step
        return StepDone(step, loss, grad_norm, lr, time.perf_counter() - t0)

    def _may_update(self, step: int, loss: float, grad_norm: float, finite: bool) -> bool:
        """fp16: gradients that overflowed from a finite loss skip the update (the scaler halves its
        scale and counts it). Otherwise, and for a loss that is itself not finite (no scale mends the
        forward pass), the NaN/Inf guard decides: stop (raises) or skip the update."""
        if self.scaler is not None and math.isfinite(loss):
            self.scaler.update(finite)
            if not finite:
                return False
        return self.guard.allows_update(step, loss, grad_norm)

    def row(self, done: StepDone) -> dict:
        """The step's metrics.jsonl row: loss and speed, then what it measured (memory of every rank
        when it moved, bytes on the wire by collective, dtype and parallel dimension, the spread of
        step time across ranks), the planner's prediction beside it, and the replica groups' share."""
        mine = self.memory.kinds(self._state)
        spread, by_rank = rank_stats(self.rt, done.seconds, mine)
        c = self.counter
        return dict(step=done.step, loss=done.loss, lr=done.lr, grad_norm=done.grad_norm, tokens=self.tokens,
                    tokens_per_s=self.tokens_per_step / done.seconds, step_time_s=done.seconds,
                    mfu=self.step_flops / done.seconds / self.peak_flops,
                    peak_mem_bytes=mine["peak"], model_state_bytes=self._state.total,
                    comm_bytes=dict(c.bytes), comm_bytes_by_dtype=dict(c.by_dtype), comm_bytes_by_dim=dict(c.by_dim),
                    **wire_fields(self.pm, c, self.job.layout.grad_compression), **spread,
                    **self.memory.row_fields(by_rank), **(self.plan.metrics_fields() if self.plan else {}),
                    **self.replicas.row(), **(self.scaler.metrics() if self.scaler else {}))
