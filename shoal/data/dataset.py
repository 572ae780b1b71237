"""A prepared token dataset on disk: what `shoal data prepare` writes and every run reads.

    DIR/shoal_dataset.json       the manifest: FORMAT, VERSION, the tokenizer's identity, the token
                                 dtype, the text field, val_fraction, and one record per shard
    DIR/tokenizer.json           a copy of the tokenizer (absent for the byte tokenizer)
    DIR/shards/KEY.tokens        one input file's tokens: its train documents, then its held-out
                                 ones, each followed by eos; little-endian uint16 or uint32
    DIR/shards/KEY.docs          uint64 end offset (in tokens) of each of those documents, in order
    DIR/shards/KEY.mask          only where the file has fine-tuning examples: uint8 per token, 0 where
                                 the token is not a target of the loss (a prompt)
    DIR/shards/KEY.json          the shard's record (written last: a shard without it is unfinished)
    DIR/parts/I-of-N.json        with `--shard I/N`, what each machine's part contributed

A shard's KEY is made from its input file's name (relative to the corpus root), so adding files
to a corpus leaves the other shards as they are. Its record holds the input file's size and mtime
(an unchanged file is not tokenized again), its token and document counts, and a BLAKE2b checksum
of its two files. Opening checks every shard's size against the record, and re-hashes any whose
modification time moved (copied, edited, or damaged after preparation): cheap for a corpus of any
size, while a changed byte is still caught.

The held-out split is by document and decided here, once: a document is held out when a hash of
its name falls below val_fraction (`in_val`). A run reads the train parts of all shards as one
stream and the held-out parts as another (stream.py), without loading either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

import numpy as np

from shoal.errors import UserError
from shoal.files import write_json

FORMAT = "shoal-token-dataset"
VERSION = 1
MANIFEST = "shoal_dataset.json"
SHARDS, PARTS = "shards", "parts"
TOKENS, DOCS, RECORD, MASK = ".tokens", ".docs", ".json", ".mask"
DOC_DTYPE = np.dtype("<u8")
# In the fallback split (see split_tail), held-out text never takes more than this of the corpus.
MAX_VAL_SHARE = 0.5


@dataclass(frozen=True)
class ShardRecord:
    """One input file's tokens, as KEY.json records them."""

    key: str
    source: str
    """The input file's name relative to the corpus root."""
    source_size: int
    source_mtime_ns: int
    train_tokens: int
    val_tokens: int
    train_docs: int
    val_docs: int
    checksum: str
    """BLAKE2b of KEY.tokens followed by KEY.docs."""
    tokens_mtime_ns: int
    """KEY.tokens' modification time when it was written: a later one means it must be re-hashed."""
    loss_mask: bool = False
    """KEY.mask exists: one uint8 per token, 0 where the token is not a target of the loss (the
    prompt of a fine-tuning example); the checksum then covers it after KEY.docs."""

    @property
    def tokens(self) -> int:
        return self.train_tokens + self.val_tokens

    @property
    def docs(self) -> int:
        return self.train_docs + self.val_docs


@dataclass(frozen=True)
class Settings:
    """What decides a dataset's tokens beside its inputs: a shard made with other settings is redone."""

    tokenizer: str
    """The tokenizer's identity (for a tokenizer.json, a hash of its content)."""
    vocab_size: int
    eos_id: int
    dtype: str
    text_field: str
    val_fraction: float


def shard_key(source_name: str) -> str:
    """A file name for the shard of this input: readable prefix, hash of the full name."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", source_name)[-48:].lstrip("._") or "file"
    return f"{slug}-{hashlib.blake2b(source_name.encode(), digest_size=6).hexdigest()}"


def in_val(doc_name: str, val_fraction: float) -> bool:
    """Whether a document is held out: a hash of its name, so the choice never depends on the
    other documents (adding files does not move existing ones between splits)."""
    h = int.from_bytes(hashlib.blake2b(doc_name.encode("utf-8", "replace"), digest_size=8).digest(), "little")
    return h < val_fraction * 2**64


TOKEN_DTYPES = ("<u2", "<u4")
"""How tokens are stored: 16 bits while the vocabulary fits, else 32."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(TOKEN_DTYPES[vocab_size > 1 << 16])


def file_checksum(*paths: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for path in paths:
        with open(path, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
    return h.hexdigest()


def shard_paths(directory: str, key: str) -> tuple[str, str, str]:
    base = os.path.join(directory, SHARDS, key)
    return base + TOKENS, base + DOCS, base + RECORD


def mask_path(directory: str, key: str) -> str:
    return os.path.join(directory, SHARDS, key + MASK)


_JSON_TYPES = {"int": int, "str": str, "bool": bool, "float": (int, float)}


def from_json(cls: type, raw: object):
    """A ShardRecord or Settings from its JSON table, each field of the type it declares (JSON says
    nothing of types: a hand edit or another tool may write "12" or null); TypeError naming the first
    that is not."""
    made = cls(**raw)
    for f in dataclasses.fields(cls):
        value = getattr(made, f.name)
        if not isinstance(value, _JSON_TYPES[f.type]) or (isinstance(value, bool) and f.type != "bool"):
            raise TypeError(f"{f.name} is {value!r:.40}, expected {f.type}")
    return made


def read_record(directory: str, key: str) -> ShardRecord | None:
    """The shard's record, or None when the shard is missing or unfinished."""
    try:
        with open(shard_paths(directory, key)[2]) as f:
            return from_json(ShardRecord, json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def write_manifest(directory: str, settings: Settings, records: list[ShardRecord], tokenizer_file: str | None) -> None:
    """The manifest, unless the folder's already says the same: every run on a prepared corpus passes here
    (each rank of each start), and a durable write is an fsync, the slowest part of a start that reuses
    every shard."""
    manifest = {"format": FORMAT, "version": VERSION, **asdict(settings), "tokenizer_file": tokenizer_file,
                "tokens": sum(r.tokens for r in records), "documents": sum(r.docs for r in records),
                "shards": [asdict(r) for r in records]}
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            if json.load(f) == manifest:
                return
    except (OSError, ValueError):  # none yet, or damaged: written below
        pass
    write_json(path, manifest)


def shard_problem(directory: str, record: ShardRecord, itemsize: int) -> str | None:
    """What is wrong with a shard's files against its record, or None: sizes always, the checksum
    when the tokens file's modification time moved since it was written."""
    tokens, docs, _ = shard_paths(directory, record.key)
    try:
        st, docs_size = os.stat(tokens), os.path.getsize(docs)
    except OSError as e:
        return f"is missing ({e.filename}: {e.strerror})"
    if (st.st_size, docs_size) != (record.tokens * itemsize, record.docs * DOC_DTYPE.itemsize):
        return f"is {st.st_size} bytes where its record says {record.tokens * itemsize}: cut or overwritten"
    mask = [mask_path(directory, record.key)] if record.loss_mask else []
    if mask and (not os.path.isfile(mask[0]) or os.path.getsize(mask[0]) != record.tokens):
        return "has a loss mask that is missing or cut"
    if st.st_mtime_ns != record.tokens_mtime_ns and file_checksum(tokens, docs, *mask) != record.checksum:
        return "changed after preparation (its checksum differs)"
    return None


def prepared_settings(path: str) -> tuple[str, float] | None:
    """(data.tokenizer, data.val_fraction) a prepared dataset was made with, from its manifest alone;
    None for a path that is not one (or whose manifest cannot be read: open_dataset says why)."""
    try:
        with open(os.path.join(os.path.expanduser(path), MANIFEST)) as f:
            raw = json.load(f)
        tokenizer = raw.get("tokenizer_file")
        return (os.path.join(os.path.abspath(os.path.expanduser(path)), tokenizer) if tokenizer else "byte",
                float(raw["val_fraction"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def is_dataset(path: str) -> bool:
    return os.path.isfile(os.path.join(os.path.expanduser(path), MANIFEST))


@dataclass
class Dataset:
    """An opened, checked prepared dataset."""

    path: str
    settings: Settings
    shards: list[ShardRecord]
    tokenizer_file: str | None
    """The tokenizer.json inside the folder, when it was not the byte tokenizer."""

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.settings.dtype)

    def fingerprint(self) -> str:
        """What its tokens are: the settings and every shard's checksum, hashed."""
        spec = json.dumps([asdict(self.settings), [r.checksum for r in self.shards]])
        return hashlib.blake2b(spec.encode(), digest_size=8).hexdigest()

    def files(self) -> list[str]:
        return [shard_paths(self.path, r.key)[0] for r in self.shards]

    def mask_files(self) -> list[str]:
        """Each shard's loss mask file, or "" where every token is trained."""
        return [mask_path(self.path, r.key) if r.loss_mask else "" for r in self.shards]


def open_dataset(path: str, field: str = "data.path") -> Dataset:
    """Read DIR's manifest and check every shard against it; UserError naming `field` when it is not
    a complete dataset of this version or a shard was changed or cut after preparation."""
    directory = os.path.abspath(os.path.expanduser(path))
    fix = "prepare it again: `shoal data prepare` with the same arguments redoes only what is missing or changed"
    try:
        with open(os.path.join(directory, MANIFEST)) as f:
            raw = json.load(f)
    except FileNotFoundError:
        parts = os.path.join(directory, PARTS)
        if os.path.isdir(parts):
            raise UserError(field, path, f"is a dataset prepared in parts whose parts are not all done "
                                         f"({', '.join(sorted(os.listdir(parts))) or 'none'} written); run the "
                                         "missing `shoal data prepare --shard I/N` parts") from None
        raise UserError(field, path, f"has no {MANIFEST}: not a prepared dataset; {fix}") from None
    except (OSError, ValueError) as e:
        raise UserError(field, path, f"{MANIFEST} cannot be read ({e}); {fix}") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT or raw.get("version") != VERSION:
        raise UserError(field, path, f"{MANIFEST} is not a {FORMAT} of version {VERSION}; {fix}")
    try:
        settings = from_json(Settings, {k: raw[k] for k in Settings.__dataclass_fields__})
        shards = [from_json(ShardRecord, r) for r in raw["shards"]]
    except (KeyError, TypeError) as e:
        raise UserError(field, path, f"{MANIFEST} is incomplete ({e}); {fix}") from None
    if settings.dtype not in TOKEN_DTYPES:
        raise UserError(field, path, f"{MANIFEST} stores tokens as {settings.dtype!r:.40}, not as shoal does; {fix}")
    dataset = Dataset(directory, settings, shards, raw.get("tokenizer_file"))
    for r in shards:
        if problem := shard_problem(directory, r, dataset.dtype.itemsize):
            raise UserError(field, path, f"shard {shard_paths(directory, r.key)[0]} {problem}; {fix}")
    if not shards or sum(r.tokens for r in shards) == 0:
        raise UserError(field, path, "the dataset holds no tokens; prepare it from files with text")
    return dataset
