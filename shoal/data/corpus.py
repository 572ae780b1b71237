"""What a run trains on: `data.path` or the `[data.mix]` table, as opened prepared datasets.

A prepared folder (`shoal data prepare`) is opened as it is, after checking it was made with the
run's tokenizer and held-out share. Any other data path is prepared on first use into the cache
($SHOAL_CACHE_DIR/tokens/NAME-HASH/, the hash of the path, tokenizer, text field and held-out share)
by the same code, under a file lock so that launchers starting at once tokenize it once; later runs
reuse it, and an edited corpus redoes only the files that changed.

Each corpus gives a train stream (its shards' train parts) and a held-out one. A corpus so small
that hashing held out none of its documents, or all of them, holds out the tail of its stream
instead (split_tail).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from shoal.cache import cache_dir, one_filler
from shoal.data import dataset as ds
from shoal.data.sources import STDLIB, stdlib_root
from shoal.data.stream import Region, TokenStream
from shoal.data.tokenizer import Tokenizer, load_tokenizer
from shoal.errors import UserError


@dataclass
class Corpus:
    name: str
    """The data path as the user wrote it."""
    weight: float
    train: TokenStream
    val: TokenStream
    train_docs: int
    val_docs: int
    dataset: ds.Dataset
    train_mask: TokenStream | None = None
    """The loss mask beside train (1: a target of the loss), where fine-tuning examples need one."""
    val_mask: TokenStream | None = None


def default_cache_dir() -> str:
    return os.fspath(cache_dir() / "tokens")


def data_paths(data) -> dict[str, float]:
    """data.mix, or data.path with weight 1."""
    return dict(data.mix) if data.mix else {data.path: 1.0}


def take_the_prepared(cfg, given) -> None:
    """Prepared datasets (`shoal data prepare`) bring the tokenizer and held-out share they were made
    with, unless data.tokenizer or data.val_fraction is given (corpus.check_prepared refuses a
    mismatch, and corpora that disagree). `cfg`: a JobConfig; `given`: the keys set in it."""
    made = [m for p in data_paths(cfg.data) if (m := ds.prepared_settings(p)) is not None]
    for key, value in (("tokenizer", {m[0] for m in made}), ("val_fraction", {m[1] for m in made})):
        if f"data.{key}" not in given and len(value) == 1:
            setattr(cfg.data, key, value.pop())


def load_data(data, model_vocab_size: int) -> tuple[Tokenizer, list[Corpus]]:
    """The tokenizer and the corpora of a [data] config section (JobConfig.data).

    `shoal train` calls this before it starts any worker, so every data mistake (path, file,
    format, tokenizer, cache folder) is one line from one process; workers then reuse what it made.
    """
    tokenizer = load_tokenizer(data.tokenizer)
    if tokenizer.vocab_size > model_vocab_size:
        raise UserError("data.tokenizer", data.tokenizer,
                        f"has token ids up to {tokenizer.vocab_size - 1} but model.vocab_size={model_vocab_size}; "
                        f"--set model.vocab_size={tokenizer.vocab_size}")
    if data.document_mask and not getattr(tokenizer, "has_eos", True):
        raise UserError("data.document_mask", True, f"{data.tokenizer} has no end-of-text token to find where "
                                                    "documents begin; use a tokenizer with one (</s>, <|endoftext|>)")
    field = "data.mix" if data.mix else "data.path"
    corpora = [open_corpus(path, weight, tokenizer, data, field) for path, weight in data_paths(data).items()]
    return tokenizer, corpora


def open_corpus(path: str, weight: float, tokenizer: Tokenizer, data, field: str = "data.path") -> Corpus:
    if ds.is_dataset(path):
        dataset = ds.open_dataset(path, field)
        check_prepared(dataset, path, tokenizer, data)
    else:
        dataset = _cached(path, tokenizer, data, field)
    (train, val, train_docs, val_docs), masks = splits(dataset), (None, None)
    if any(dataset.mask_files()):  # cut exactly as the tokens are
        masks = tuple(_masks(dataset, s) for s in (train, val))
    return Corpus(path, weight, train, val, train_docs, val_docs, dataset, *masks)


def _masks(dataset: ds.Dataset, tokens: TokenStream) -> TokenStream:
    """The loss mask of a split: the same regions of the shards' mask files (ones where a shard has none)."""
    by_file = dict(zip(dataset.files(), dataset.mask_files()))
    return TokenStream([Region(by_file[r.file], r.start, r.length) for r in tokens.regions], np.uint8)


def check_prepared(dataset: ds.Dataset, path: str, tokenizer: Tokenizer, data) -> None:
    """A prepared dataset must hold the run's tokenizer's ids and its held-out share."""
    s = dataset.settings
    if s.tokenizer != tokenizer.identity:
        made = os.path.join(dataset.path, dataset.tokenizer_file) if dataset.tokenizer_file else "byte"
        raise UserError("data.tokenizer", data.tokenizer, f"is not the tokenizer {path} was prepared with ({made}); "
                                                          f"set data.tokenizer={made}, or prepare it again with this one")
    if not math.isclose(s.val_fraction, data.val_fraction):
        raise UserError("data.val_fraction", data.val_fraction,
                        f"{path} was prepared holding out {s.val_fraction}; set data.val_fraction={s.val_fraction}, "
                        f"or prepare it again with --val-fraction {data.val_fraction}")


def _cached(path: str, tokenizer: Tokenizer, data, field: str) -> ds.Dataset:
    """The raw corpus at `path`, prepared into the cache (or reused from there)."""
    from shoal.data.prepare import prepare

    root = check_cache_dir(os.path.expanduser(data.cache_dir) if data.cache_dir else default_cache_dir())
    where = stdlib_root() if path == STDLIB else os.path.abspath(os.path.expanduser(path))
    spec = [ds.FORMAT, ds.VERSION, where, tokenizer.identity, data.text_field, data.val_fraction]
    key = hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:20]
    folder = os.path.join(root, f"{_slug(path)}-{key}")
    with one_filler(folder):
        try:
            prepare([path], data.tokenizer, folder, text_field=data.text_field, val_fraction=data.val_fraction,
                    field=field, out_field="data.cache_dir")
        except OSError as e:  # the folder passed check_cache_dir; this is e.g. a full disk
            raise UserError("data.cache_dir", root, f"writing the token cache failed ({e.strerror}); free space "
                                                    "there or set data.cache_dir elsewhere") from None
    return ds.open_dataset(folder, "data.cache_dir")


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


def splits(dataset: ds.Dataset) -> tuple[TokenStream, TokenStream, int, int]:
    """(train stream, held-out stream, train documents, held-out documents)."""
    files = dataset.files()
    train = TokenStream([Region(f, 0, r.train_tokens) for f, r in zip(files, dataset.shards)], dataset.dtype)
    val = TokenStream([Region(f, r.train_tokens, r.val_tokens) for f, r in zip(files, dataset.shards)], dataset.dtype)
    train_docs, val_docs = sum(r.train_docs for r in dataset.shards), sum(r.val_docs for r in dataset.shards)
    if len(val) and len(train):
        return train, val, train_docs, val_docs
    if not len(train):  # every document hashed into val: cut the tail of them instead
        train, train_docs = val, val_docs
    return split_tail(train, train_docs, dataset.settings.eos_id, dataset.settings.val_fraction)


def split_tail(stream: TokenStream, docs: int, eos_id: int, val_fraction: float
               ) -> tuple[TokenStream, TokenStream, int, int]:
    """Hold out the tail of the stream: cut at the last document boundary that leaves at least
    val_fraction of the tokens in val, or, if that boundary would give val more than
    MAX_VAL_SHARE of the corpus (one huge document), cut mid-document. Either way no token is in
    both splits."""
    n = len(stream)
    want = min(max(1, math.ceil(val_fraction * n)), n - 1)  # leave train at least a token
    lowest, cut = int(n * (1 - ds.MAX_VAL_SHARE)), n - want
    boundary = _last_index(stream, eos_id, lo=lowest, hi=cut)  # eos at index i: a document ends there
    if boundary is not None:
        cut = boundary + 1
    val_docs = sum(int(np.count_nonzero(c == eos_id)) for c in _chunks(stream, cut, n))
    train_docs = docs - val_docs + (boundary is None)  # a mid-document cut leaves a piece on each side
    return stream.slice(0, cut), stream.slice(cut, n), train_docs, val_docs


def _chunks(stream: TokenStream, lo: int, hi: int, size: int = 1 << 22) -> Iterator[np.ndarray]:
    for start in range(lo, hi, size):
        yield stream.read(start, min(size, hi - start))


def _last_index(stream: TokenStream, value: int, lo: int, hi: int, chunk: int = 1 << 22) -> int | None:
    """Largest i in [lo, hi) with stream[i] == value, reading back in chunks."""
    end = hi
    while end > lo:
        start = max(lo, end - chunk)
        hits = np.flatnonzero(stream.read(start, end - start) == value)
        if len(hits):
            return start + int(hits[-1])
        end = start
    return None


def _slug(path: str) -> str:
    """A readable prefix for the cache folder's name; the hash after it is what identifies the content."""
    name = os.path.basename(os.path.normpath(os.path.expanduser(path))) or "corpus"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:40]
