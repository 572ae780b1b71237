"""Tokenize a corpus once into a memory-mapped cache file with a held-out split.

A cache file holds both splits, so publishing it is one atomic `os.replace`:

    64-byte header   b"SHOALTOK", then little-endian uint64: format version, bytes per token,
                     n_train, n_val, train documents, val documents
    train tokens     every train document followed by eos
    val tokens       every held-out document followed by eos

The file name carries a hash of everything that decides its content (each file's path, size and
mtime, the tokenizer's identity, the JSON text field, the val fraction), so a changed corpus or
tokenizer gets a new file instead of stale tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shoal.cache import cache_dir
from shoal.data.sources import Source, empty_corpus_error, list_documents, read_documents
from shoal.data.tokenizer import Tokenizer
from shoal.errors import UserError

FORMAT_VERSION = 1
MAGIC = b"SHOALTOK"
HEADER = struct.Struct("<8s6Q")
HEADER_BYTES = 64  # HEADER padded, so the token arrays start aligned
# Documents go to the tokenizer in batches this big: HF's encode_batch parallelises over a batch.
BATCH_DOCS, BATCH_CHARS = 1024, 16 << 20
# In the fallback split (see _split_tail), held-out text never takes more than this of the corpus.
MAX_VAL_SHARE = 0.5
# Corpora at least this big get a line on stderr when tokenizing starts (about a second of work).
TELL_ABOVE_MB = 32


@dataclass
class TokenCache:
    """The token stream of a corpus, split by document into train and held-out parts."""

    train: np.ndarray
    """Memory-mapped uint16 (vocab <= 65536) or uint32 token ids; eos after every document."""
    val: np.ndarray
    """The held-out split, same layout; no document in it is also in train."""
    path: str
    """The cache file."""
    n_train_docs: int
    n_val_docs: int
    built: bool
    """True when this call tokenized the corpus, False when it reused a cache file."""


def default_cache_dir() -> str:
    return os.fspath(cache_dir() / "tokens")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def build_token_cache(
    path: str,
    tokenizer: Tokenizer,
    cache_dir: str | os.PathLike | None = None,
    text_field: str = "text",
    val_fraction: float = 0.01,
) -> TokenCache:
    """Tokenize `path` (see sources.py) into `cache_dir`, or reuse the cache file already there.

    Safe to call from every rank at once: one process tokenizes while the others wait on a file
    lock, and the file only appears under its final name once complete.
    """
    if not 0 <= val_fraction < 1:
        raise UserError("data.val_fraction", val_fraction, "must be in [0, 1); 0.01 holds out 1% of documents")
    sources = list_documents(path, text_field)
    cache_dir = check_cache_dir(os.path.expanduser(cache_dir) if cache_dir is not None else default_cache_dir())
    file = os.path.join(cache_dir, f"{_slug(path)}-{cache_key(sources, tokenizer, val_fraction)}.bin")
    if os.path.isdir(file):  # cannot be replaced by a file, so no rebuild can help
        raise UserError("data.cache_dir", cache_dir, f"{file} is a folder where the token cache file belongs; remove it")
    if os.path.exists(file):
        try:
            return open_token_cache(file, built=False)
        except DamagedCache as e:  # a crash mid-copy, a full disk, a hand edit: tokenize again
            print(f"shoal: token cache {file} is damaged ({e}); rebuilding it", file=sys.stderr, flush=True)
    with _build_lock(file):
        try:  # another process may have built (or rebuilt) it while we waited for the lock
            return open_token_cache(file, built=False)
        except (FileNotFoundError, DamagedCache):
            pass
        try:
            _build(file, path, sources, tokenizer, val_fraction)
        except OSError as e:  # the folder exists and passed check_cache_dir; this is e.g. a full disk
            fix = ("the folder was removed while the cache was written (a clean-up of the cache?); run again"
                   if isinstance(e, FileNotFoundError) else "free space there")
            raise UserError("data.cache_dir", cache_dir, f"writing the token cache failed ({e.strerror}); "
                                                         f"{fix} or set data.cache_dir elsewhere") from None
        return open_token_cache(file, built=True)


def check_cache_dir(cache_dir: str) -> str:
    """Create the cache folder if needed; a file in its place or no write permission is a UserError."""
    fix = "set data.cache_dir (or $SHOAL_CACHE_DIR) to a writable folder"
    if os.path.exists(cache_dir) and not os.path.isdir(cache_dir):
        raise UserError("data.cache_dir", cache_dir, f"is a file, not a folder; {fix}")
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:  # a file further up, a read-only file system, no permission
        raise UserError("data.cache_dir", cache_dir, f"cannot be created ({e.strerror}); {fix}") from None
    if not os.access(cache_dir, os.W_OK | os.X_OK):
        raise UserError("data.cache_dir", cache_dir, f"is not writable; {fix}")
    return cache_dir


def load_data(data, model_vocab_size: int) -> tuple[Tokenizer, "TokenCache"]:
    """The tokenizer and the token cache for a [data] config section (JobConfig.data).

    `shoal train` calls this before it starts any worker, so every data mistake (path, file,
    encoding, tokenizer, cache folder) is one line from one process; workers then reuse the cache.
    """
    from shoal.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(data.tokenizer)
    if tokenizer.vocab_size > model_vocab_size:
        raise UserError("data.tokenizer", data.tokenizer,
                        f"has token ids up to {tokenizer.vocab_size - 1} but model.vocab_size={model_vocab_size}; "
                        f"--set model.vocab_size={tokenizer.vocab_size}")
    cache = build_token_cache(data.path, tokenizer, data.cache_dir or None, text_field=data.text_field,
                              val_fraction=data.val_fraction)
    return tokenizer, cache


def cache_key(sources: list[Source], tokenizer: Tokenizer, val_fraction: float) -> str:
    spec = {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer.identity,
        "dtype": token_dtype(tokenizer.vocab_size).str,  # a vocabulary past 65,536 ids needs uint32
        "val_fraction": val_fraction,
        "sources": [[s.path, s.size, s.mtime_ns, s.text_field] for s in sources],
    }
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:24]


class DamagedCache(Exception):
    """A token cache file that is not what build_token_cache writes (rebuilt when found)."""


def open_token_cache(file: str, built: bool = False) -> TokenCache:
    """Memory-map a cache file written by build_token_cache; DamagedCache if it is not one."""
    try:
        with open(file, "rb") as f:
            raw = f.read(HEADER.size)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise
    except OSError as e:  # a folder or an unreadable file under the cache's name
        raise DamagedCache(f"cannot be read ({e.strerror})") from None
    magic, version, itemsize, n_train, n_val, train_docs, val_docs = (
        HEADER.unpack(raw) if len(raw) == HEADER.size else (b"",) + (0,) * 6)
    if magic != MAGIC or version != FORMAT_VERSION or itemsize not in (2, 4):
        raise DamagedCache("not a shoal token cache of this version")
    expected = HEADER_BYTES + (n_train + n_val) * itemsize
    if size != expected:
        raise DamagedCache(f"{size} bytes where its header promises {expected}: truncated or overwritten")
    dtype = np.dtype(np.uint16 if itemsize == 2 else np.uint32)

    def view(offset: int, n: int) -> np.ndarray:
        # np.memmap refuses zero-length maps; an empty split is a plain empty array.
        return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=(n,)) if n else np.zeros(0, dtype)

    return TokenCache(train=view(HEADER_BYTES, n_train), val=view(HEADER_BYTES + n_train * itemsize, n_val),
                      path=file, n_train_docs=train_docs, n_val_docs=val_docs, built=built)


def in_val(doc_name: str, val_fraction: float) -> bool:
    """Whether a document is held out: a hash of its name, so the choice never depends on the
    other documents (adding files does not move existing ones between splits)."""
    h = int.from_bytes(hashlib.blake2b(doc_name.encode("utf-8", "replace"), digest_size=8).digest(), "little")
    return h < val_fraction * 2**64


def _build(file: str, path: str, sources: list[Source], tokenizer: Tokenizer, val_fraction: float) -> None:
    t0 = time.perf_counter()
    dtype = token_dtype(tokenizer.vocab_size)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    mb = sum(s.size for s in sources) / 1e6
    # Said only where a person would wonder what is taking so long: a small corpus caches in well under
    # a second, and a line there would only push a real error further up the screen.
    tell = mb >= TELL_ABOVE_MB
    if tell:
        print(f"shoal: tokenizing {path} ({len(sources)} files, {mb:.1f} MB) with {tokenizer.identity} "
              f"into {file}", file=sys.stderr, flush=True)
    cache_dir, base = os.path.split(file)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=base + ".", suffix=".tmp")
    val_fd, val_tmp = tempfile.mkstemp(dir=cache_dir, prefix=base + ".", suffix=".val.tmp")
    try:
        with os.fdopen(fd, "w+b") as out, os.fdopen(val_fd, "w+b") as val_out:
            out.write(b"\0" * HEADER_BYTES)
            counts = {True: [0, 0], False: [0, 0]}  # in val -> [tokens, documents]
            for batch in _doc_batches(sources):
                pieces: dict[bool, list[np.ndarray]] = {True: [], False: []}
                for (name, _), ids in zip(batch, tokenizer.encode_many([text for _, text in batch])):
                    if len(ids) == 0:
                        continue
                    held_out = in_val(name, val_fraction)
                    pieces[held_out] += [ids.astype(dtype, copy=False), eos]
                    counts[held_out][0] += len(ids) + 1
                    counts[held_out][1] += 1
                for held_out, f in ((False, out), (True, val_out)):
                    if pieces[held_out]:
                        f.write(np.concatenate(pieces[held_out]).tobytes())
            (n_train, train_docs), (n_val, val_docs) = counts[False], counts[True]
            if n_train + n_val == 0:
                raise empty_corpus_error(path)
            if val_fraction > 0 and (n_val == 0 or n_train == 0):
                out.flush()
                n_train, n_val, train_docs, val_docs = _split_tail(tmp, dtype, tokenizer.eos_id, val_fraction,
                                                                   out, val_out, n_train, n_val)
            else:
                val_out.seek(0)
                while chunk := val_out.read(64 << 20):
                    out.write(chunk)
            out.seek(0)
            out.write(HEADER.pack(MAGIC, FORMAT_VERSION, dtype.itemsize, n_train, n_val, train_docs, val_docs))
            out.flush()
            os.fsync(out.fileno())  # the name must never point at a half-written file, even after a crash
        os.replace(tmp, file)  # atomic: concurrent builders each publish a complete, identical file
    finally:
        for t in (tmp, val_tmp):
            with contextlib.suppress(FileNotFoundError):
                os.remove(t)
    if tell or time.perf_counter() - t0 > 2:
        print(f"shoal: cached {n_train:,} train tokens ({train_docs} docs) + {n_val:,} val tokens ({val_docs} docs) "
              f"in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)


def _split_tail(tmp: str, dtype: np.dtype, eos_id: int, val_fraction: float, out, val_out,
                n_train: int, n_val: int) -> tuple[int, int, int, int]:
    """Fallback when hashing put every document on one side (a corpus of a few documents).

    Holds out the tail of the stream instead: cut at the last document boundary that leaves at
    least val_fraction of the tokens in val, or, if that boundary would give val more than
    MAX_VAL_SHARE of the corpus (one huge document), cut mid-document. Either way no token is in
    both splits. Returns (n_train, n_val, train_docs, val_docs) with val placed after train.
    """
    if n_train == 0:  # everything hashed into val: move it all to the train region, then split that
        val_out.seek(0)
        while chunk := val_out.read(64 << 20):
            out.write(chunk)
        out.flush()
        n_train, n_val = n_val, 0
    stream = np.memmap(tmp, dtype=dtype, mode="r", offset=HEADER_BYTES, shape=(n_train,))
    want = min(max(1, int(np.ceil(val_fraction * n_train))), n_train - 1)  # leave train at least a token
    lowest = int(n_train * (1 - MAX_VAL_SHARE))
    cut = n_train - want
    boundary = _last_index(stream, eos_id, lo=lowest, hi=cut)  # eos at index i: a document ends there
    if boundary is not None:
        cut = boundary + 1
    total_docs = _count(stream, eos_id, 0, n_train)
    val_docs = _count(stream, eos_id, cut, n_train)
    train_docs = total_docs - val_docs + (boundary is None)  # a mid-document cut leaves a piece on each side
    del stream
    return cut, n_train - cut, train_docs, val_docs


def _last_index(a: np.ndarray, value: int, lo: int, hi: int, chunk: int = 1 << 22) -> int | None:
    """Largest i in [lo, hi) with a[i] == value, scanning back in chunks (a may be larger than RAM)."""
    end = hi
    while end > lo:
        start = max(lo, end - chunk)
        hits = np.flatnonzero(a[start:end] == value)
        if len(hits):
            return start + int(hits[-1])
        end = start
    return None


def _count(a: np.ndarray, value: int, lo: int, hi: int, chunk: int = 1 << 22) -> int:
    return sum(int(np.count_nonzero(a[i:min(i + chunk, hi)] == value)) for i in range(lo, hi, chunk))


def _doc_batches(sources: list[Source]) -> Iterator[list[tuple[str, str]]]:
    batch: list[tuple[str, str]] = []
    chars = 0
    for source in sources:
        for name, text in read_documents(source):
            if not text:
                continue
            batch.append((name, text))
            chars += len(text)
            if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
    if batch:
        yield batch


@contextlib.contextmanager
def _build_lock(file: str) -> Iterator[None]:
    """Serialise builders of one cache file so that one tokenizes and the rest reuse its result.

    Only an optimisation: without flock (Windows, some network filesystems) builders race, and
    the atomic replace still leaves one complete file.
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(file + ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"shoal: waiting for another process to finish {file}", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            yield  # flock unsupported here
            return
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _slug(path: str) -> str:
    """A readable prefix for the cache file name; the hash after it is what identifies the content."""
    name = os.path.basename(os.path.normpath(os.path.expanduser(path))) or "corpus"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:40]
