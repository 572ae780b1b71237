"""Write a safetensors file one tensor at a time: the header first (it only needs names, shapes
and dtypes), then each tensor's bytes as it arrives.

safetensors' own save_file wants the whole state dict in memory at once, which is what a model
larger than one host cannot give. The format is small and documented
(https://huggingface.co/docs/safetensors/index): an 8-byte little-endian header length N, N bytes
of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}
padded with spaces to a multiple of 8, then the tensors' raw little-endian bytes back to back,
with no holes. safetensors' own loaders read what this writes (tests/unit/test_safetensors_stream.py).
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}


class SafetensorsStream:
    """`with SafetensorsStream(path, specs, metadata) as f: f.write(name, tensor)` for each name of
    `specs` ({name: (shape, dtype)}) in that order; closing checks that every tensor was written."""

    def __init__(self, path: Path, specs: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 metadata: dict[str, str] | None = None):
        self.path, self.specs, self.order = Path(path), specs, list(specs)
        header, offset = {}, 0
        for name, (shape, dtype) in specs.items():
            size = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        if metadata:
            header["__metadata__"] = metadata
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the tensors start 8-byte aligned, as safetensors writes them
        # Written under a temporary name and renamed when complete: a crash never leaves a torn file behind.
        self._partial = self.path.with_name(self.path.name + ".partial")
        self._file = open(self._partial, "wb")
        self._file.write(struct.pack("<Q", len(text)) + text)
        self._next = 0

    def write(self, name: str, tensor: torch.Tensor) -> None:
        assert self._next < len(self.order) and name == self.order[self._next], (name, self.order[self._next:][:1])
        shape, dtype = self.specs[name]
        assert tuple(tensor.shape) == tuple(shape) and tensor.dtype == dtype, (name, tensor.shape, tensor.dtype)
        assert tensor.device.type == "cpu"
        # A uint8 view of a contiguous CPU tensor shares its memory: no second copy of the bytes.
        self._file.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
        self._next += 1

    def __enter__(self) -> "SafetensorsStream":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def close(self) -> None:
        """Complete: every tensor written, the file renamed into place."""
        self._file.close()
        assert self._next == len(self.order), f"{len(self.order) - self._next} tensors never written"
        os.replace(self._partial, self.path)

    def discard(self) -> None:
        """Incomplete (a failed write, a full disk): the partial file goes, and its space with it."""
        try:
            self._file.close()  # flushing what is buffered can fail again on a full disk
        except OSError:
            pass
        self._partial.unlink(missing_ok=True)
