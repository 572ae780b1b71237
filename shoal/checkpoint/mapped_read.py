"""Loading a DCP checkpoint's tensors straight from the page cache into the model, hashing them on the way.

DCP's FileSystemReader `torch.load`s each saved tensor into freshly allocated memory and then copies
it into its destination: 828 MB loaded at 0.1-0.2x the speed of a plain read here, most of it page
faults on the fresh memory (about 0.25 s/GB). MappedReader maps each shard file and hands torch's own
loader (`torch.serialization._load`, weights_only, as `torch.load(mmap=True)` calls it) a storage over
the mapped bytes, so each tensor is a view of the file, copied once, into the model.

Loading is memory-bound: a second pass over the file to verify its checksum costs about as much as
the copy. So the files given to verify are hashed in the same pass, a tensor's bytes just before
they are copied (and still in the CPU's cache). The checkpointer applies nothing until the checksums
match (checkpointer.Checkpointer._load); every file's size was checked before. Anything this path
does not expect (storage transforms, a non-tensor value, a torch without that private loader) is
read by SafeReader, DCP's own path, and its files are hashed by the checkpointer instead.
"""

from __future__ import annotations

import functools
import io
import mmap
import sys
from pathlib import Path

import torch
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future
from torch.distributed._shard._utils import narrow_tensor_by_index  # as DCP's FileSystemReader imports it

from shoal.checkpoint import store
from shoal.checkpoint.safe_read import SafeReader


class _Window(io.RawIOBase):
    """A read-only file over a memoryview: how torch's zip reader sees one saved tensor's bytes."""

    def __init__(self, view: memoryview):
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), len(self._view) - self._pos)
        buffer[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


@functools.cache
def _torch_loader():
    """torch's zip loader, taking a storage to view (private, as torch.load(mmap=True) uses it); None if absent."""
    try:
        from torch.serialization import _load, _open_zipfile_reader
    except ImportError:
        return None
    import inspect

    return (_load, _open_zipfile_reader) if "overall_storage" in inspect.signature(_load).parameters else None


def _mapped_tensor(mapped: mmap.mmap, offset: int, length: int, known: dict) -> torch.Tensor:
    """The tensor torch.save wrote at [offset, offset + length) of a mapped file, as a view of it.

    `known` remembers, by length, the bytes before the data of each archive torch's loader has read
    and what they unpickled to. An archive of the same length whose bytes up to its data are the same
    (zip headers, the pickled shape, strides and dtype, the byte order) holds the same kind of tensor
    at the same place: a model's tensors come in a few shapes, and opening the zip and running the
    weights-only unpickler (pure Python) took most of the time."""
    from torch import _weights_only_unpickler

    for before, (dtype, size, stride, storage_offset, nbytes) in known.get(length, ()):
        if mapped[offset:offset + len(before)] == before:
            return torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset + len(before)).view(
                dtype).as_strided(size, stride, storage_offset)
    _load, _open_zipfile_reader = _torch_loader()
    overall = torch.frombuffer(mapped, dtype=torch.uint8, count=length, offset=offset).untyped_storage()
    with _open_zipfile_reader(io.BufferedReader(_Window(memoryview(mapped)[offset:offset + length]))) as archive:
        native = archive.has_record("byteorder") and archive.get_record("byteorder") == sys.byteorder.encode()
        tensor = _load(archive, "cpu", _weights_only_unpickler, overall_storage=overall)
    storage = tensor.untyped_storage()
    start = storage.data_ptr() - overall.data_ptr()
    if native and storage.nbytes() and 0 < start and start + storage.nbytes() <= length:  # a view of this archive
        known.setdefault(length, []).append((mapped[offset:offset + start], (
            tensor.dtype, tensor.size(), tensor.stride(), tensor.storage_offset(), storage.nbytes())))
    return tensor


class MappedReader(SafeReader):
    """SafeReader (restricted index, tensors only) whose tensor reads come from a mapping of each file.

    hash_as_read: names of files to checksum (with store.hasher(algorithm)) as they are read;
    `hashed` then maps each one read whole to its hex digest."""

    def __init__(self, path, hash_as_read: list[str] = (), algorithm: str = store.HASH):
        super().__init__(path)
        self.hash_as_read, self.algorithm = set(hash_as_read), algorithm
        self.hashed: dict[str, str] = {}

    def read_data(self, plan, planner) -> Future:
        per_file: dict[str, list] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        if _torch_loader() is None or any(item.type == LoadItemType.BYTE_IO
                                          or self.storage_data[item.storage_index].transform_descriptors
                                          for item in plan.items):  # not what shoal writes: DCP's own path decides (and refuses bytes)
            return super().read_data(plan, planner)
        for name, items in per_file.items():
            self._read_file(name, items, planner)
        done: Future = Future()  # DCP waits on a torch future
        done.set_result(None)
        return done

    def _read_file(self, name: str, items: list, planner) -> None:
        with open(Path(self.path) / name, "rb") as f:
            # MAP_PRIVATE: writable for torch.frombuffer, shared with the page cache unless written
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        digest = store.hasher(self.algorithm) if name in self.hash_as_read else None
        whole, hashed_to, known = memoryview(mapped), 0, {}
        for item in sorted(items, key=lambda item: self.storage_data[item.storage_index].offset):
            info = self.storage_data[item.storage_index]
            saved = narrow_tensor_by_index(_mapped_tensor(mapped, info.offset, info.length, known),
                                           item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            assert target.size() == saved.size(), f"{item.storage_index}: {target.size()} vs {saved.size()}"
            if digest is not None and info.offset + info.length > hashed_to:
                # the file up to this tensor's end: its bytes are in the CPU's cache for the copy below
                digest.update(whole[hashed_to:info.offset + info.length])
                hashed_to = info.offset + info.length
            target.copy_(saved)
            planner.commit_tensor(item, target)
            del saved  # the views go before the mapping does
        if digest is not None:
            digest.update(whole[hashed_to:])
            self.hashed[name] = digest.hexdigest()
        del whole
