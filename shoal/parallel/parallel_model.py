"""This rank's share of a parallel model, and how one step's micro-batches run through it.

`parallelize` builds it and records which wrapper data parallelism used, so the training step and
evaluation never probe wrappers: `forward_backward` runs a step's micro-batches (through the
pipeline schedule, or one by one: see _reduce_gradients), `eval_loss` the
held-out batches, each under the run's precision and, with tensor parallelism, the vocabulary-
parallel loss.
"""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from shoal.model.kernels import attention_kernels
from shoal.model.moe import MoE
from shoal.model.precision import compute_dtype, upcast
from shoal.model.transformer import cross_entropy

Batch = tuple[torch.Tensor, ...]
"""(inputs, targets[, documents]): the documents tensor only with data.document_mask (data/loader.py)."""


@dataclass
class ParallelModel:
    modules: list[nn.Module]
    """The whole model, or the pipeline stages this rank runs (each a model with some layers)."""
    device: torch.device
    precision: str = "fp32"
    """train.precision: fp32, or bf16 / bf16-params / fp8 (autocast bf16) or fp16 (autocast float16), all
    over fp32 weights (README's table); fp8's linear layers are torchao's (parallel/float8.py)."""
    schedule: object | None = None
    """The pipeline schedule when pp > 1."""
    has_first_stage: bool = True
    has_last_stage: bool = True
    zero: int = 0
    """The ZeRO stage the data-parallel wrapper runs (0 when nothing is sharded)."""
    wrapper: str = "none"
    """How data parallelism wraps the model: none, ddp or fsdp (FSDP2, also its `replicate`)."""
    vocab_parallel: bool = False
    """Tensor parallelism keeps the logits sharded over the vocabulary; the loss is computed in place."""
    grad_compressor: object | None = None
    """The DDP or FSDP2 hooks' state when gradients are compressed (parallel/compression.py): its
    per-step byte counts go to the metrics and its state into checkpoints."""
    loss_scaler: object | None = None
    """fp16's dynamic loss scaler (train/loss_scale.py): the step scales and unscales with it, and
    its scale goes into checkpoints (train_state.json)."""
    diloco: object | None = None
    """The outer optimizer across dp_replicate groups when DiLoCo is on (parallel/diloco.py): the
    trainer calls it after each inner step; its state goes into checkpoints."""
    attention: str = ""
    """The attention kernel the step runs, e.g. 'flash (cuda)' (shoal/model/kernels.py), for the run summary."""
    context: object | None = None
    """With cp > 1, this rank's part of each sequence (parallel/context_parallel.py): batches are split
    before the model sees them (the documents tensor stays whole) and `loss` is its share."""
    loss: Callable = cross_entropy
    """(logits, targets) -> the loss to backpropagate (the pipeline schedule's loss_fn is the same)."""
    activation_offload: bool = False
    """train.activation_offload: tensors saved for backward wait in host memory (pinned on CUDA)."""
    scaled_loss: "ScaledLoss | None" = None
    """With a pipeline, the loss function its schedule differentiates, which carries fp16's loss scale."""

    def parameters(self):
        for m in self.modules:
            yield from m.parameters()

    def slow_link_state(self) -> list:
        """What gradient compression and DiLoCo keep beside the optimizer: error feedback, PowerSGD's
        Q, DiLoCo's outer copy and momentum. Memory counts it as optimizer state, as the planner
        does (planner/slow_links.py)."""
        held = list(self.grad_compressor.state_dict().values()) if self.grad_compressor is not None else []
        if self.diloco is not None:
            held += [*self.diloco.outer.values(), *self.diloco.buf.values()]
        return held

    def forward_backward(self, batches: list[Batch], loss_scale: float = 1.0) -> torch.Tensor:
        """Forward and backward over one step's micro-batches; this rank's mean loss (detached, unscaled).
        Gradients end up averaged over the micro-batches and reduced over data-parallel ranks, and
        multiplied by `loss_scale` (fp16's dynamic loss scale, a power of two: exact both ways)."""
        with self._compute(), self._saved_tensors():
            if self.schedule is not None:  # the schedule divides gradients by the micro-batch count
                self.scaled_loss.scale = loss_scale
                total = self._run_schedule("step", *(torch.cat(parts) for parts in zip(*batches))) / loss_scale
                self.scaled_loss.scale = 1.0  # evaluation's losses are plain
            else:
                model, total, n = self.modules[0], torch.zeros((), device=self.device), len(batches)
                for i, (inputs, targets, *documents) in enumerate(batches):
                    inputs, targets = self._local(inputs, targets)
                    with self._reduce_gradients(model, last=i == n - 1):
                        loss = self.loss(model(*self._on_device(inputs, *documents)), targets.to(self.device)) / n
                        (loss * loss_scale if loss_scale != 1.0 else loss).backward()
                    total += _scalar(loss)
        _sum_partial_gradients(self.parameters())
        return total

    @torch.no_grad()
    def eval_loss(self, batches: list[Batch], micro_batch: int) -> torch.Tensor:
        """Mean held-out loss of this rank's batches (0 on ranks without the last pipeline stage)."""
        for m in self.modules:
            m.eval()
        losses = []
        with self._compute():
            for batch in batches:
                if self.schedule is not None:
                    losses.append(self._run_schedule("eval", *batch))
                    continue
                for inputs, targets, *documents in zip(*(t.split(micro_batch) for t in batch)):  # bounded memory
                    inputs, targets = self._local(inputs, targets)
                    logits = self.modules[0](*self._on_device(inputs, *documents))
                    losses.append(_scalar(self.loss(logits, targets.to(self.device))))
        for m in self.modules:
            m.train()
        return torch.stack(losses).mean()

    def _saved_tensors(self):
        """train.activation_offload: what autograd saves for backward goes to host memory (pinned on
        CUDA, so the copies run asynchronously) and comes back when backward needs it."""
        if not self.activation_offload:
            return nullcontext()
        return torch.autograd.graph.save_on_cpu(pin_memory=self.device.type == "cuda")

    def _compute(self):
        """This device's attention kernels, autocast for bf16, fp8 and fp16 (fp32 master weights and
        optimizer state) and the vocabulary-parallel loss.

        Autocast runs without its cast cache: it keeps each weight's bf16 copy for the whole region
        (all micro-batches), while FSDP2 frees and re-gathers the weights between them; with it,
        zero=3's bf16 loss was 0.027 off one process's after 4 steps (tests/dist/test_precision_dist.py),
        without it 2e-5."""
        stack = ExitStack()
        stack.enter_context(attention_kernels(self.device))
        if self.precision != "fp32":  # bf16, bf16-params, fp8 (its linear layers cast further), fp16
            stack.enter_context(torch.autocast(self.device.type, dtype=compute_dtype(self.precision),
                                               cache_enabled=False))
        if self.vocab_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            stack.enter_context(loss_parallel())
        return stack

    def _reduce_gradients(self, model: nn.Module, last: bool):
        """Gradient accumulation. Replicated gradients (DDP, FSDP2's `replicate`) are reduced once, on the
        step's last micro-batch: they are whole on every rank anyway. Sharded ones (ZeRO-2/3) are
        reduce-scattered after every micro-batch's backward, as the ZeRO paper and torchtitan do: FSDP2
        with its gradient sync off accumulates the unsharded gradient, the whole model's in fp32 on every
        rank, which undoes what sharding saves (the planner counts them sharded: planner/memory.py).
        Compressed reductions (parallel/compression_fsdp.py) stay once per step: their error feedback and
        step count are per optimizer step."""
        if self.wrapper == "ddp":
            return nullcontext() if last else model.no_sync()
        if self.wrapper == "fsdp":
            sharded = self.zero >= 2 and self.grad_compressor is None
            model.set_requires_gradient_sync(last or sharded)
            if self.zero == 2:  # ZeRO-2 keeps parameters gathered until the step's last backward
                model.set_reshard_after_backward(last)
        return nullcontext()

    def _local(self, inputs_BT: torch.Tensor, targets_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's tokens and targets of whole sequences: all of them, or its chunks under context
        parallelism (the documents tensor stays whole: see parallel/context_parallel.py)."""
        if self.context is None:
            return inputs_BT, targets_BT
        return self.context.split(inputs_BT), self.context.split(targets_BT)

    def _on_device(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        return [t.to(self.device) for t in tensors]

    def _run_schedule(self, method: str, inputs: torch.Tensor, targets: torch.Tensor,
                      *documents: torch.Tensor) -> torch.Tensor:
        """One pipeline step (or forward-only pass) over the local batch; mean loss on the last stage.
        The first stage takes the documents tensor beside the tokens and each stage passes it on."""
        losses: list = []
        run = getattr(self.schedule, method)
        inputs, targets = self._on_device(*self._local(inputs, targets))
        first = self._on_device(inputs, *documents)
        if self.has_first_stage and self.has_last_stage:
            run(*first, target=targets, losses=losses)
        elif self.has_first_stage:
            run(*first)
        elif self.has_last_stage:
            run(target=targets, losses=losses)
        else:
            run()
        return torch.stack([_scalar(x) for x in losses]).mean() if losses else torch.zeros((), device=self.device)


class ScaledLoss:
    """A pipeline schedule's loss function times fp16's loss scale: the schedule runs backward from
    what it returns, so the scale has to be inside (1 outside a step: evaluation's losses are plain)."""

    def __init__(self, loss_fn):
        self.loss_fn, self.scale = loss_fn, 1.0

    def __call__(self, *args):
        loss = self.loss_fn(*args)
        return loss * self.scale if self.scale != 1.0 else loss


def _sum_partial_gradients(params) -> None:
    """Sum pending partial gradients over their group once, now.

    Tensor parallelism leaves the gradient of a replicated weight that met sharded activations (the
    sequence-parallel norms' weights) as a Partial DTensor: a sum over the TP group not yet done.
    DTensor runs that all-reduce whenever an op reads the gradient and does not keep the result:
    once in the gradient norm and three times in AdamW's step, four per weight per step (counted on
    `tiny`, tp2: 53 all-reduces per step where 13 do).
    """
    from torch.distributed.tensor import DTensor, Replicate

    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(placements=[Replicate() if pl.is_partial() else pl for pl in g.placements])


def set_aux_loss_scale(modules: list[nn.Module], scale: float) -> None:
    """MoE load-balancing gradients are scaled as the main loss is: 1 / micro-batches per step
    without a pipeline (the step divides each micro-batch's loss), 1 with one (the schedule scales
    all gradients afterwards)."""
    for m in modules:
        for sub in m.modules():
            if isinstance(sub, MoE):
                sub.aux_grad_scale = scale


def _scalar(loss: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return upcast((loss.full_tensor() if isinstance(loss, DTensor) else loss).detach())
