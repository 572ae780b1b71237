"""Refuse a run that will not fit, before any worker starts.

The planner's memory model (shoal/planner/memory.py) predicts the busiest rank's peak for the run's
own layout, precision and flash attention; it is compared with what this machine offers each local
rank: the GPU's memory on CUDA, or the host's MemAvailable shared by the local ranks on CPU. A run
that does not fit gets one line naming both numbers and the first single change that would fit,
instead of an allocator error minutes later or the OOM killer. The model is a prediction, so
`train.memory_check=false` skips it.

The launcher checks once and sets CHECKED_ENV for its workers, which do not check again (their
siblings' allocations would shrink MemAvailable under them); under torchrun each rank checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from shoal.errors import UserError

GiB = 2**30
CHECKED_ENV = "SHOAL_MEMORY_CHECKED"


@dataclass(frozen=True)
class Device:
    """What one local rank can use."""

    kind: str
    """'cuda' or 'cpu'."""
    capacity: float
    """Bytes one rank may use."""
    reserved: float
    """Bytes the runtime takes before the model does."""
    what: str
    """Where the capacity comes from, for the message."""


def local_device(local_ranks: int) -> Device | None:
    """This machine's memory per local rank, as the workers will see it (None: unknown)."""
    torch = _torch_if_cuda()
    if torch is not None:
        # Asking for the device's properties initializes the CUDA runtime in this (launcher)
        # process. That is safe: the workers are new interpreters that the elastic agent starts
        # (no fork of an initialized CUDA), and reading properties allocates nothing on the device.
        n = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(0)
        sharing = -(-local_ranks // n)  # more ranks than GPUs share one
        return Device("cuda", props.total_memory / sharing, cuda_reserved_bytes(props.name),
                      f"{props.name}" + (f" shared by {sharing} ranks" if sharing > 1 else ""))
    available = mem_available()
    if available is None:
        return None
    from shoal.planner.local_hardware import LOCAL_PROCESS_BYTES

    return Device("cpu", available / local_ranks, LOCAL_PROCESS_BYTES,
                  f"MemAvailable {available / GiB:.1f} GiB / {local_ranks} local rank{'s' * (local_ranks > 1)}")


def check_local_ranks(nproc: int) -> Device | None:
    """Refuse more local ranks than this machine holds processes of (each takes `reserved` before it
    does anything: an interpreter and its libraries, or a CUDA context), before any is started;
    this machine's memory per rank otherwise (None: unknown)."""
    device = local_device(nproc)
    if device is not None and device.capacity <= device.reserved:
        raise UserError("--nproc", nproc, f"{device.what} leaves {device.capacity / 2**20:.3g} MiB per rank, less "
                                          f"than a rank's own {device.reserved / 2**20:.3g} MiB; use fewer ranks")
    return device


def cuda_reserved_bytes(device_name: str) -> float:
    """The catalog's reserved bytes for this GPU (CUDA context, NCCL, workspaces), or the default."""
    from shoal.planner.hardware import GPU, lookup_gpu

    entry = lookup_gpu(device_name)
    return entry.reserved_bytes if entry else GPU.reserved_bytes


def _torch_if_cuda():
    """torch when a CUDA device is usable, else None. torch is imported only where an NVIDIA driver
    is loaded, so a CPU machine's refusal stays well under a second (importing torch takes longer)."""
    if not (os.path.isdir("/proc/driver/nvidia/gpus") or os.path.exists("/dev/nvidiactl")):
        return None
    import torch

    return torch if torch.cuda.is_available() else None


def mem_available() -> float | None:
    """The host's MemAvailable in bytes (the kernel's estimate of what can be allocated without
    swapping); None where there is no /proc/meminfo (not Linux): the check is then skipped."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def predict_peak(job, device: Device):
    """The planner's MemoryBreakdown of the busiest rank for this job on this device."""
    from shoal.planner.hardware import CATALOG
    from shoal.planner.layout import Cluster, Workload
    from shoal.planner.memory import memory

    # The memory model reads only the device's capacity and reserved bytes; the rest of the entry
    # (rates, links) is the time model's and does not matter here.
    gpu = replace(next(iter(CATALOG.values())), name=device.kind, hbm_bytes=device.capacity,
                  reserved_bytes=device.reserved)
    return memory(Workload.of_job(job), job.layout, Cluster(gpu, job.world, job.world))


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
        return peak.total
    raise UserError(
        "memory", _Text(f"{peak.total / GiB:.1f} GiB per rank predicted"),
        f"more than the {device.capacity / GiB:.1f} GiB available ({device.what}); {suggest(job, device)}, "
        f"or set train.memory_check=false to run anyway")


def suggest(job, device: Device) -> str:
    """The first single change that the layout rules accept and the memory model says would fit."""
    from shoal.layout import problems

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


class _Text(str):
    """A value printed without quotes in the UserError line."""

    def __repr__(self) -> str:
        return str(self)


def local_world_size(nproc: int) -> int:
    """Ranks on this machine: --nproc, torchrun's LOCAL_WORLD_SIZE, or 1."""
    return nproc or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def check_host_bounds(job) -> None:
    """What the planner's model leaves out, bounded by this host's physical memory: the held-out
    batches every rank keeps and the rotary tables (sized by model.max_seq_len, not the batch); and,
    where the device's memory is unknown, the model state and one micro-batch's logits. Without it
    such a run swaps for minutes or is killed without a word."""
    from shoal.model.analytics import param_counts

    ram = _physical_memory()
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
        ("model.max_seq_len", m.max_seq_len, 8 * m.max_seq_len * m.head_dim, "rotary tables; lower it"),
    ]
    for name, value, need, fix in terms:
        if need > ram:
            raise UserError(name, value, f"needs about {need / 2**30:,.0f} GiB per rank, more than this "
                                         f"machine's {ram / 2**30:,.0f} GiB of memory ({fix})")


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not POSIX
        return None
