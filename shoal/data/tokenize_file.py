"""One input file -> one shard of a prepared dataset (dataset.py): what each `shoal data prepare`
worker process runs (prepare.py hands out the files)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict

import numpy as np

from shoal.data import dataset as ds
from shoal.data.chat import chat_template, render
from shoal.data.readers import Example, Source, read_documents
from shoal.errors import UserError
from shoal.files import write_json

# Documents go to the tokenizer in batches this big: encode_batch parallelises over a batch.
BATCH_DOCS, BATCH_CHARS = 1024, 16 << 20


def tokenize_file(source: Source, tokenizer_spec: str, directory: str, settings: ds.Settings,
                  field: str = "data.path") -> ds.ShardRecord:
    """One input file -> its shard (tokens, document ends, loss mask where fine-tuning examples need one,
    record), written under temporary names and renamed into place, the record last."""
    from shoal.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_spec)
    shard = ShardWriter(directory, ds.shard_key(source.name), np.dtype(settings.dtype), settings.eos_id)
    limit = np.iinfo(shard.dtype).max
    template = None if tokenizer_spec == "byte" else chat_template(tokenizer_spec)
    try:
        for batch in _doc_batches(source, field):
            for name, ids, mask in _encoded(batch, tokenizer, template, source):
                if int(ids.max()) > limit:  # never store an id modulo the dtype
                    raise UserError("data.tokenizer", tokenizer_spec, f"gives id {int(ids.max())}, more than the "
                                                                      f"{shard.dtype} tokens hold; its vocabulary "
                                                                      "size is wrong")
                shard.add(ids, mask, held_out=ds.in_val(name, settings.val_fraction))
            shard.flush()
        record = shard.finish(source)
    finally:
        shard.clean()
    return record


def _encoded(batch: list, tokenizer, template, source: Source) -> Iterator[tuple[str, np.ndarray, np.ndarray | None]]:
    """(name, token ids, loss mask or None when every token is trained) of each non-empty document;
    a fine-tuning example's segments are tokenized one by one, so the mask falls on their borders."""
    if all(isinstance(doc, str) for _, doc in batch):  # pre-training text: no mask, no segments to join
        for (name, _), ids in zip(batch, tokenizer.encode_many([doc for _, doc in batch])):
            if len(ids):
                yield name, ids, None
        return
    segments = []  # per document: its (text, trained) segments
    for name, doc in batch:
        if isinstance(doc, str):
            segments.append(((doc, True),))
        else:
            segments.append(doc.segments if isinstance(doc, Example) else
                            render(template, doc.messages, f"{source.path}:{name.rsplit(':', 1)[-1]}"))
    flat = tokenizer.encode_many([text for parts in segments for text, _ in parts])
    i = 0
    for (name, _), parts in zip(batch, segments):
        pieces, i = flat[i:i + len(parts)], i + len(parts)
        ids = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        if len(ids) == 0:
            continue
        trained = [t for _, t in parts]
        mask = None if all(trained) else np.concatenate([np.full(len(p), t, np.uint8) for p, t in zip(pieces, trained)])
        yield name, ids, mask


class ShardWriter:
    """Train documents stream to disk; held-out ones (a small share) wait in memory to follow them.
    The loss mask file starts at the first document that needs one, the documents before it all ones."""

    def __init__(self, directory: str, key: str, dtype: np.dtype, eos_id: int):
        self.directory, self.key, self.dtype = directory, key, dtype
        self.paths = ds.shard_paths(directory, key) + (ds.mask_path(directory, key),)
        self.tmp = [p + f".{os.getpid()}.tmp" for p in self.paths]
        self.eos = np.array([eos_id], dtype=dtype)
        self.tokens = open(self.tmp[0], "wb")
        self.mask = None
        self.train: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.val: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.ends = {False: [], True: []}  # held out -> document lengths
        self.written = 0

    def add(self, ids: np.ndarray, mask: np.ndarray | None, held_out: bool) -> None:
        ids = np.concatenate([ids.astype(self.dtype, copy=False), self.eos])
        if mask is not None:
            mask = np.append(mask, np.uint8(1))  # the eos that ends a reply is trained: the model learns to stop
        (self.val if held_out else self.train).append((ids, mask))
        self.ends[held_out].append(len(ids))

    def flush(self) -> None:
        self._write(self.train)
        self.train = []

    def _write(self, docs: list) -> None:
        if not docs:
            return
        if self.mask is None and any(m is not None for _, m in docs):
            self.mask = open(self.tmp[3], "wb")
            self.mask.write(np.ones(self.written, np.uint8).tobytes())
        self.tokens.write(np.concatenate([ids for ids, _ in docs]).tobytes())
        if self.mask is not None:
            self.mask.write(np.concatenate([np.ones(len(i), np.uint8) if m is None else m for i, m in docs]).tobytes())
        self.written += sum(len(ids) for ids, _ in docs)

    def finish(self, source: Source) -> ds.ShardRecord:
        train_tokens = self.written
        self._write(self.val)
        self.tokens.close()
        if self.mask is not None:
            self.mask.close()
        lengths = np.array(self.ends[False] + self.ends[True], dtype=ds.DOC_DTYPE)
        np.cumsum(lengths, out=lengths)
        lengths.tofile(self.tmp[1])
        files = [self.tmp[0], self.tmp[1]] + ([self.tmp[3]] if self.mask is not None else [])
        checksum = ds.file_checksum(*files)
        for tmp, path in zip(self.tmp, self.paths):
            if tmp in files:
                os.replace(tmp, path)
        if self.mask is None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.paths[3])  # an earlier version of this shard's
        record = ds.ShardRecord(key=self.key, source=source.name, source_size=source.size,
                                source_mtime_ns=source.mtime_ns, train_tokens=train_tokens,
                                val_tokens=self.written - train_tokens, train_docs=len(self.ends[False]),
                                val_docs=len(self.ends[True]), checksum=checksum,
                                tokens_mtime_ns=os.stat(self.paths[0]).st_mtime_ns, loss_mask=self.mask is not None)
        # not fsynced: a record lost to a power cut only means its file is tokenized again
        write_json(self.paths[2], asdict(record), durable=False)
        return record

    def clean(self) -> None:
        for f in (self.tokens, self.mask):
            if f is not None:
                f.close()
        for tmp in self.tmp:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def _doc_batches(source: Source, field: str) -> Iterator[list]:
    batch: list = []
    chars = 0
    for name, doc in read_documents(source, field):
        if not doc:
            continue
        batch.append((name, doc))
        chars += len(doc) if isinstance(doc, str) else 1024
        if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch
