"""What this rank holds: model state by kind (local shards), and the activations autograd saves."""

from __future__ import annotations

import resource
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def reset_peak_mem(device: torch.device) -> None:
    """Start the peak over, so it is this run's when one process trains several (benchmarks, tests)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: the peak resident set (VmHWM) restarts from the current one
    except OSError:
        pass  # other systems: the process's lifetime peak (ru_maxrss) it is


def peak_mem_bytes(device: torch.device) -> int:
    """Peak allocated device memory on CUDA; peak resident set size of this process on CPU, since
    reset_peak_mem."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024  # kB
    except (OSError, StopIteration, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding this rank's data: a DTensor's local shard, an AsyncCollectiveTensor's
    result (wrapper subclasses have no storage of their own), or the tensor itself."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    while is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        t = getattr(t, names[0])
    return t


def _local_nbytes(t) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class StateBytes:
    """Bytes of parameters, gradients and optimizer state this rank actually holds."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def model_state(params, optimizer, beside_optimizer=()) -> StateBytes:
    """`beside_optimizer`: other per-step state counted with the optimizer's (ParallelModel.slow_link_state)."""
    params = list(params)
    state = [v for state in optimizer.state.values() for v in state.values()] + list(beside_optimizer)
    return StateBytes(
        params=sum(_local_nbytes(p) for p in params),
        grads=sum(_local_nbytes(p.grad) for p in params if p.grad is not None),
        # under zero=1 only this rank's share has state; 0-d tensors are step counters
        optimizer=sum(_local_nbytes(v) for v in state if isinstance(v, torch.Tensor) and v.ndim > 0))


class ActivationMeter:
    """The peak bytes of tensors autograd holds for backward during a step: the activations.

    A saved-tensors hook sees every tensor an op keeps for its backward; parameters (and their
    local shards under DTensor, and FSDP's unsharded copies, which are Parameters too) are model
    state, not activations, and are left out. Tensors that share a storage (views) count once,
    and a storage stops counting when autograd frees the last tensor saved from it, so the peak is
    what is live at once, across a pipeline schedule's interleaved micro-batches too. Recompute
    (activation checkpointing) installs its own hooks inside its regions, so what it recomputes is
    not counted, as it is not kept. Used on one step: the hook costs Python per saved tensor.
    """

    def __init__(self, params):
        self._param_storages = {_local(p).untyped_storage().data_ptr() for p in params}
        self._live: dict[int, list[int]] = {}  # storage pointer -> [bytes, tensors saved from it]
        self.current = self.peak = 0
        self._ctx = None

    def _pack(self, t: torch.Tensor):
        if isinstance(t, torch.nn.Parameter) or t.device.type == "meta":
            return t
        storage = _local(t).untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._param_storages:
            return t
        entry = self._live.get(ptr)
        if entry is None:
            entry = self._live[ptr] = [storage.nbytes(), 0]
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._release, ptr)
        return t

    def _release(self, ptr: int) -> None:
        entry = self._live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._live[ptr]

    def __enter__(self) -> ActivationMeter:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)



class RankMemory:
    """This rank's memory by kind for metrics.jsonl: parameters, gradients and optimizer state
    (exact, from the tensors), activations (the ActivationMeter on the first step this process
    runs: at a fixed shape every step saves the same; not under torch.compile, whose graphs the
    hook would break), and the peak (CUDA allocator, or resident set size on CPU).

    `row_fields` puts every rank's numbers in a row only when one moved by more than CHANGED of
    what the last such row said: they settle after the first steps (a CPU process's resident set
    creeps by a few pages a step), and thousands of ranks' numbers in every row would be most of
    the file."""

    CHANGED = 0.01

    def __init__(self, params, device: torch.device, measure_activations: bool):
        self.device = device
        self._meter = ActivationMeter(params) if measure_activations else None
        self.activations = float("nan")  # NaN until measured (a null in metrics.jsonl)
        self._last = None

    @contextmanager
    def measure_first_step(self):
        """Around the first step's forward and backward; a no-op on every later step."""
        meter, self._meter = self._meter, None
        if meter is None:
            yield
            return
        with meter:
            yield
        self.activations = meter.peak

    def kinds(self, state: StateBytes) -> dict[str, float]:
        return dict(params=state.params, grads=state.grads, optimizer=state.optimizer,
                    activations=self.activations, peak=peak_mem_bytes(self.device))

    def row_fields(self, by_rank: dict[str, list]) -> dict:
        if self._last is not None and not self._moved(self._last, by_rank):
            return {}
        self._last = by_rank
        return {"memory_by_rank": by_rank}

    def _moved(self, before: dict[str, list], now: dict[str, list]) -> bool:
        def far(a, b) -> bool:
            return (a is None) != (b is None) or (a is not None and abs(a - b) > self.CHANGED * max(abs(a), 1))
        return before.keys() != now.keys() or any(len(before[k]) != len(now[k]) or any(map(far, before[k], now[k]))
                                                  for k in now)

