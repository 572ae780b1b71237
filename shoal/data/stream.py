"""Regions of several token files read as one array, without loading or mapping them.

A split of a prepared dataset (its shards' train parts, or their held-out parts) is one
TokenStream: `read(start, n)` and `windows(starts, n)` gather tokens across shard boundaries with
positioned reads (os.pread), so a rank's memory holds the windows it asked for and nothing that
grows with the corpus (a memory map would count every page it touched in the process's RSS).
A plain numpy array works wherever a stream does (ArrayStream), for tests and small corpora.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

# Open file descriptors kept per stream: a corpus of many thousand shards must not exhaust the
# process's limit (often 1024), and a step's windows mostly touch a few shards each.
MAX_OPEN_FILES = 64


@dataclass(frozen=True)
class Region:
    file: str
    """"" for a region of ones that no file holds (the loss mask of a shard where every token is trained)."""
    start: int
    """First token of the region in the file."""
    length: int


class TokenStream:
    """The concatenation of `regions` (each a run of tokens in a file)."""

    def __init__(self, regions: list[Region], dtype: np.dtype):
        self.regions = [r for r in regions if r.length > 0]
        self.dtype = np.dtype(dtype)
        self.offsets = np.cumsum([0] + [r.length for r in self.regions], dtype=np.int64)
        self._fds: OrderedDict[str, int] = OrderedDict()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n) of the stream."""
        assert 0 <= start and start + n <= len(self), (start, n, len(self))
        out = np.empty(n, dtype=self.dtype)
        done = 0
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while done < n:
            region, skip = self.regions[i], start + done - int(self.offsets[i])
            take = min(n - done, region.length - skip)
            size = self.dtype.itemsize
            if region.file:
                raw = os.pread(self._fd(region.file), take * size, (region.start + skip) * size)
                out[done:done + take] = np.frombuffer(raw, dtype=self.dtype)
            else:
                out[done:done + take] = 1
            done += take
            i += 1
        return out

    def windows(self, starts: np.ndarray, n: int) -> np.ndarray:
        """[len(starts), n] tokens, row i from starts[i]."""
        return np.stack([self.read(int(s), n) for s in starts]) if len(starts) else np.zeros((0, n), self.dtype)

    def slice(self, start: int, stop: int) -> "TokenStream":
        """Tokens [start, stop) as a stream of their own (the fallback held-out split cuts one)."""
        regions = []
        for r, lo in zip(self.regions, self.offsets[:-1]):
            a, b = max(start, int(lo)), min(stop, int(lo) + r.length)
            if a < b:
                regions.append(Region(r.file, r.start + a - int(lo), b - a))
        return TokenStream(regions, self.dtype)

    def _fd(self, file: str) -> int:
        fd = self._fds.pop(file, None)
        if fd is None:
            fd = os.open(file, os.O_RDONLY)
            if len(self._fds) >= MAX_OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[file] = fd
        return fd

    def __del__(self):
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __getstate__(self):  # file descriptors do not travel; a copy opens its own
        return {**self.__dict__, "_fds": OrderedDict()}


class ArrayStream:
    """A numpy array (or memory map) with TokenStream's surface."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens
        self.dtype = tokens.dtype

    def __len__(self) -> int:
        return len(self.tokens)

    def read(self, start: int, n: int) -> np.ndarray:
        return np.asarray(self.tokens[start:start + n])

    def windows(self, starts: np.ndarray, n: int) -> np.ndarray:
        return np.asarray(self.tokens[np.asarray(starts, dtype=np.int64)[:, None] + np.arange(n)])

    def slice(self, start: int, stop: int) -> "ArrayStream":
        return ArrayStream(self.tokens[start:stop])


def as_stream(tokens) -> TokenStream | ArrayStream:
    return tokens if isinstance(tokens, (TokenStream, ArrayStream)) else ArrayStream(np.asarray(tokens))
