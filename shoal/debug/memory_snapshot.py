"""`debug.memory_snapshot = true`: record every CUDA allocation with its stack and write the
allocator's snapshot at the end of the run, <out>/memory_snapshot_rank<N>.pickle. Drag it into
https://pytorch.org/memory_viz to see what held memory at the peak (activations per block,
optimizer state, fragmentation). CPU has no caching allocator to record: the flag is ignored
there, with a warning.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

MAX_ENTRIES = 100_000
"""Allocation events kept (a ring buffer): a few steps of a large model; each costs ~1 KB with its stack."""


class MemorySnapshot:
    def __init__(self, enabled: bool, device: torch.device, out: Path, rank: int = 0):
        self.path = Path(out) / f"memory_snapshot_rank{rank}.pickle"
        self.active = enabled and device.type == "cuda"
        if enabled and not self.active:
            if rank == 0:
                print(f"shoal: warning: debug.memory_snapshot=true is ignored on {device.type}: it records the "
                      f"CUDA allocator", file=sys.stderr, flush=True)
            return
        if self.active:
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)

    def dump(self) -> Path | None:
        """Write the snapshot and stop recording; the path written, or None when inactive."""
        if not self.active:
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(self.path))
        torch.cuda.memory._record_memory_history(enabled=None)
        self.active = False
        return self.path
