"""Refuse a run that will not fit, before any worker starts.

The planner's memory model (shoal/planner/memory.py) predicts the busiest rank's peak for the run's
own layout, precision and flash attention; it is compared with what this machine offers each local
rank: the GPU's memory on CUDA, or the host's MemAvailable shared by the local ranks on CPU. A run
that does not fit gets one line naming both numbers and the first single change that would fit,
instead of an allocator error minutes later or the OOM killer. The model is a prediction, so
`train.memory_check=false` skips it.

The process that prepares the job checks once (shoal/launch/session.py); the workers it starts do
not check again (their siblings' allocations would shrink MemAvailable under them). Under plain
torchrun each rank prepares, so each checks.
"""

from __future__ import annotations

from dataclasses import replace

from shoal.errors import UserError
from shoal.hardware.memory import Device, GiB, local_device, physical_memory
from shoal.planner.prediction import predict_peak


def check_local_ranks(nproc: int) -> Device | None:
    """Refuse more local ranks than this machine holds processes of (each takes `reserved` before it
    does anything: an interpreter and its libraries, or a CUDA context), before any is started;
    this machine's memory per rank otherwise (None: unknown)."""
    device = local_device(nproc)
    if device is not None and device.capacity <= device.reserved:
        raise UserError("--nproc", nproc, f"{device.what} leaves {device.capacity / 2**20:.3g} MiB per rank, less "
                                          f"than a rank's own {device.reserved / 2**20:.3g} MiB; use fewer ranks")
    return device


def check_memory(job, local_ranks: int, device: Device | None = None) -> float | None:
    """Raise UserError if the predicted peak exceeds the device; return the predicted bytes per rank
    (None where this machine's memory is unknown)."""
    device = device or local_device(local_ranks)
    if device is None:
        check_host_bounds(job)
        return None
    peak = predict_peak(job, device)
    if peak.fits:
        check_host_bounds(job)
        if device.kind == "cuda":  # on CPU the host is the device: the peak above counted it
            check_host_offload(job, peak, local_ranks)
        return peak.total
    raise UserError(
        "memory", _Text(f"{peak.total / GiB:.1f} GiB per rank predicted"),
        f"more than the {device.capacity / GiB:.1f} GiB available ({device.what}); {suggest(job, device)}, "
        f"or set train.memory_check=false to run anyway")


def suggest(job, device: Device) -> str:
    """The first single change that the layout rules accept and the memory model says would fit."""
    from shoal.layout_rules import problems

    lay, t = job.layout, job.cfg.train
    tries = []
    if lay.dp > 1 and lay.zero < 3:
        tries.append(("parallel.zero=3", {"zero": 3}))
    if lay.activation_checkpoint != "full":
        tries.append(("train.activation_checkpoint=full", {"activation_checkpoint": "full"}))
    if lay.micro_batch > 1:
        tries.append(("train.micro_batch=1", {"micro_batch": 1}))
    for text, change in tries:
        changed = replace(lay, **change)
        if (not problems(changed, job.model, job.world, t.global_batch, t.seq_len)
                and predict_peak(replace(job, layout=changed), device).fits):
            return f"set {text}"
    peak = predict_peak(job, device)
    states = (peak.params + peak.grads + peak.optimizer) / GiB
    more = ("shard it over more GPUs (parallel.dp_shard with parallel.zero=3, parallel.tp or parallel.pp)"
            if device.kind == "cuda" else "ranks on one host share its memory, so use more machines")
    return (f"no single setting fits it (parameters, gradients and optimizer state alone take {states:.1f} GiB): "
            f"use a smaller model (model.preset, model.dim, model.n_layers) or {more}")


def check_host_offload(job, peak, local_ranks: int) -> None:
    """Refuse an offloading run whose local ranks together would hold more in host memory than the
    host has available (what the planner's breakdown moves off the device: `peak.host`)."""
    from shoal.hardware.memory import mem_available

    per_rank, available = peak.host, mem_available()
    if not per_rank or available is None or per_rank * local_ranks <= available:
        return
    field, value = (("parallel.offload", job.layout.offload) if job.layout.offload != "none"
                    else ("train.activation_offload", True))
    raise UserError(field, value, f"keeps {per_rank / GiB:.1f} GiB per rank in host memory, {local_ranks} local "
                                  f"rank{'s' * (local_ranks > 1)} need {per_rank * local_ranks / GiB:.1f} GiB, more than "
                                  f"the host's {available / GiB:.1f} GiB available; offload less, use fewer ranks per "
                                  "node, or set train.memory_check=false to run anyway")


def check_fp8_device() -> None:
    """Refuse train.precision=fp8 on a GPU without FP8 tensor cores (never train it silently in bf16).
    Off CUDA the recipe is emulated (parallel/float8.py)."""
    from shoal.hardware.memory import _torch_if_cuda

    torch = _torch_if_cuda()
    if torch is None:
        return
    from shoal.parallel.float8 import fp8_device_problem

    if problem := fp8_device_problem(torch.device("cuda", 0)):
        raise UserError("train.precision", "fp8", problem)


class _Text(str):
    """A value printed without quotes in the UserError line."""

    def __repr__(self) -> str:
        return str(self)


def check_host_bounds(job) -> None:
    """What the planner's model leaves out, bounded by this host's physical memory: the held-out
    batches every rank keeps and the rotary tables (sized by model.max_seq_len, not the batch); and,
    where the device's memory is unknown, the model state and one micro-batch's logits. Without it
    such a run swaps for minutes or is killed without a word."""
    from shoal.model.analytics import param_counts

    ram = physical_memory()
    if not ram:
        return
    m, t, world, micro_batch = job.model, job.cfg.train, job.world, job.layout.micro_batch
    terms = [  # (field, value, bytes per rank, fix)
        ("model", f"{param_counts(m).total:,} parameters", 16 * param_counts(m).total / world,
         "fp32 weights, gradients and AdamW's two moments; pick a smaller model or spread it over more ranks"),
        ("train.micro_batch", micro_batch, 12 * micro_batch * t.seq_len * m.vocab_size,
         "fp32 logits, their softmax and gradient for one micro-batch; lower micro_batch or seq_len"),
        ("train.eval_batches", t.eval_batches, 16 * t.eval_batches * t.global_batch * (t.seq_len + 1),
         "held-out inputs and targets kept for every evaluation; lower eval_batches"),
        ("model.max_seq_len", m.max_seq_len, 8 * m.max_seq_len * m.head_size, "rotary tables; lower it"),
    ]
    for name, value, need, fix in terms:
        if need > ram:
            raise UserError(name, value, f"needs about {need / 2**30:,.0f} GiB per rank, more than this "
                                         f"machine's {ram / 2**30:,.0f} GiB of memory ({fix})")
