"""What memory one local rank of this machine can use: the GPU's on CUDA, else the host's
MemAvailable shared by the local ranks, less what a rank's runtime takes before the model does.

torch is imported only where an NVIDIA driver is loaded, so on a CPU machine the answer comes well
under a second (importing torch takes longer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GiB = 2**30


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
    from shoal.hardware.local import LOCAL_PROCESS_BYTES

    return Device("cpu", available / local_ranks, LOCAL_PROCESS_BYTES,
                  f"MemAvailable {available / GiB:.1f} GiB / {local_ranks} local rank{'s' * (local_ranks > 1)}")


def cuda_reserved_bytes(device_name: str) -> float:
    """The catalog's reserved bytes for this GPU (CUDA context, NCCL, workspaces), or the default."""
    from shoal.hardware.gpu import GPU
    from shoal.hardware.lookup import lookup_gpu

    entry = lookup_gpu(device_name)
    return entry.reserved_bytes if entry else GPU.reserved_bytes


def _torch_if_cuda():
    """torch when a CUDA device is usable, else None."""
    if not (os.path.isdir("/proc/driver/nvidia/gpus") or os.path.exists("/dev/nvidiactl")):
        return None
    import torch

    return torch if torch.cuda.is_available() else None


def mem_available() -> float | None:
    """The host's MemAvailable in bytes (the kernel's estimate of what can be allocated without
    swapping); None where there is no /proc/meminfo (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def physical_memory() -> int | None:
    """The host's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not POSIX
        return None
