"""The hardware a job runs on, as numbers: torch-free except where it measures.

    gpu.py       what one accelerator and its links can do: the GPU record's fields
    catalog.py   the accelerators known by name, each a GPU with its sources
    overrides.py an entry with some fields changed, checked (--hw FIELD=VALUE, a --hw-file's fields)
    local.py     this machine as the planner sees it, from a measured profile (the `local` entry)
    lookup.py    an entry by its name: the one a user gives (--gpu, a --hw-file's base), torch's for a device
    memory.py    what memory one local rank of this machine can use
    peak.py      the peak FLOP/s MFU divides by (imports torch to ask the device)
    matmul.py    the one matmul timer (imports torch)

The front door, for `from shoal import hardware`: get_gpu, known_names, load_hw_file, and gpu.py's
GPU and GiB, lookup.py's lookup_gpu, and the overrides' apply_overrides and parse_hw_flags.
"""

from shoal.hardware.gpu import GPU, GiB
from shoal.hardware.overrides import apply_overrides, parse_hw_flags
from shoal.hardware.lookup import get_gpu, known_names, load_hw_file, lookup_gpu

__all__ = ["GPU", "GiB", "apply_overrides", "get_gpu", "known_names", "load_hw_file", "lookup_gpu", "parse_hw_flags"]
