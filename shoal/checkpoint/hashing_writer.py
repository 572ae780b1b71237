"""DCP's FileSystemWriter, hashing each shard as it writes it.

Hashing the bytes on their way to the file (instead of reading the file back afterwards) saves a
whole read of the checkpoint, and records the checksum of what shoal meant to write: a write the
disk got wrong is then caught when the checkpoint is loaded, not blessed by a hash of the damage.
"""

from __future__ import annotations

import io
from contextlib import contextmanager
from pathlib import Path

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from shoal.checkpoint.store import HASH, hasher


class _HashingStream(io.RawIOBase):
    """A file opened for writing that hashes everything written through it, in order. DCP only
    appends (write, tell, flush, fsync on fileno); a seek would break the hash, so it is refused."""

    def __init__(self, file):
        self._file, self._hash, self.size = file, hasher(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._hash.update(data)
        written = self._file.write(data)
        assert written == len(memoryview(data).cast("B")), "a short write would leave the hash ahead of the file"
        self.size += written
        return written

    def tell(self) -> int:
        return self.size

    def seek(self, *args) -> int:
        raise io.UnsupportedOperation("a hashed checkpoint shard is written front to back")

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def digest(self) -> dict:
        return {"bytes": self.size, HASH: self._hash.hexdigest()}


class _HashingFileSystem(FileSystem):
    def __init__(self, digests: dict):
        super().__init__()
        self._digests = digests

    @contextmanager
    def create_stream(self, path, mode: str):
        path = Path(path)
        if mode != "wb" or path.suffix != ".distcp":  # the index is written under a temporary name: hashed after
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with open(path, "wb") as file:
            stream = _HashingStream(file)
            yield stream
            file.flush()
        self._digests[path.name] = stream.digest()


def hashing_writer(directory: Path, digests: dict) -> FileSystemWriter:
    """A FileSystemWriter (one fsynced file per rank) that fills `digests` with {file name: {"bytes",
    HASH}} for each shard file it writes."""
    writer = FileSystemWriter(directory, single_file_per_rank=True, sync_files=True, thread_count=1)
    writer.fs = _HashingFileSystem(digests)
    return writer
