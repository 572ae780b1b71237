"""Reading a DCP checkpoint without executing anything it contains.

torch.distributed.checkpoint keeps its index (`.metadata`) as a plain pickle and reads it with
`pickle.load`, and its default load planner unpickles non-tensor values with
`torch.load(weights_only=False)`: either would run code from a crafted checkpoint. Here:

- the index is read by an unpickler that can build only the handful of DCP metadata classes,
  torch.Size, dtypes and layouts (Python's documented "restricting globals" pattern);
- every storage path the index names must be a plain file name inside the checkpoint directory;
- the planner refuses non-tensor values (shoal keeps those in JSON), and tensor data is read by
  DCP with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_DCP_METADATA, name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a lookup of torch.strided & co by name
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}
_DTYPES = {str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)}


class UnsafeCheckpoint(Exception):
    """A checkpoint asks for something a checkpoint never needs (a foreign class, a path outside it)."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f"its index refers to {module}.{name}, which a DCP index never contains")


def read_metadata(directory: Path) -> Metadata:
    """The DCP index of a checkpoint directory, read without running code from it."""
    data = (Path(directory) / ".metadata").read_bytes()
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint:
        raise
    except Exception as e:  # truncated or garbled
        raise UnsafeCheckpoint(f"its index .metadata cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"its index .metadata holds a {type(metadata).__name__}, not DCP Metadata")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not _plain_name(name):
            raise UnsafeCheckpoint(f"its index names the storage file {name!r}, which is not inside the checkpoint")
    return metadata


def _plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


class SafeReader(FileSystemReader):
    """FileSystemReader whose read_metadata uses the restricted unpickler above."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        if kwargs.get("rank") is not None:
            raise UnsafeCheckpoint("per-rank (use_collectives=False) checkpoints are not supported")
        metadata = read_metadata(Path(self.path))
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """The default planner, except that it never unpickles a non-tensor value."""

    def load_bytes(self, read_item, value) -> None:
        raise UnsafeCheckpoint(f"{read_item.dest_index.fqn} is a pickled object; shoal checkpoints hold tensors only")
