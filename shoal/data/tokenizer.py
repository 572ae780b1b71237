"""Tokenizers: raw UTF-8 bytes by default, or a Hugging Face `tokenizers` JSON file.

Both expose the same small surface the rest of shoal uses: `vocab_size`, `eos_id`, `identity`
(part of the token cache key, so a different tokenizer never reuses another's tokens),
`encode`, `decode`, and `encode_many` (the fast path the token cache uses).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from typing import Protocol

import numpy as np

from shoal.errors import UserError

# Special tokens that mark the end of a document, in the order we look for them.
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")


class Tokenizer(Protocol):
    vocab_size: int
    """One more than the largest id it can produce (its token count when no id is skipped)."""
    eos_id: int
    identity: str

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def encode_many(self, texts: list[str]) -> list[np.ndarray]: ...


def _as_ids(ids: Iterable[int]) -> np.ndarray:
    """Lists, numpy arrays and tensors (on any device) alike, flattened to int64."""
    if hasattr(ids, "cpu"):
        ids = ids.cpu()
    elif not hasattr(ids, "__array__") and not hasattr(ids, "__len__"):
        ids = list(ids)  # a generator
    return np.asarray(ids, dtype=np.int64).ravel()


class ByteTokenizer:
    """One token per UTF-8 byte. Byte 0 (NUL) never occurs in text, so it is the document separator."""

    vocab_size = 256
    eos_id = 0
    identity = "byte-utf8"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", errors="replace"))

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        # frombuffer views the encoded bytes without a Python loop: tokenizing the whole stdlib
        # is then about as fast as reading it.
        return [np.frombuffer(t.encode("utf-8", errors="replace"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        arr = _as_ids(ids)
        arr = arr[(arr != self.eos_id) & (arr >= 0) & (arr < 256)]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A Hugging Face `tokenizers` JSON file (the `tokenizer.json` shipped with most models)."""

    def __init__(self, path: str):
        from tokenizers import Tokenizer as _HF  # imported here: the byte default needs nothing

        self.path = os.path.abspath(os.path.expanduser(path))
        self._tok = _HF.from_file(self.path)
        # The ids the model must hold, not the number of tokens: a vocabulary may skip ids (a
        # pruned or hand-edited file), and its largest id must still have a row in the embedding
        # and fit the token cache's dtype (shards.token_dtype).
        ids = self._tok.get_vocab(with_added_tokens=True).values()
        self.vocab_size: int = max(self._tok.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
        found = [self._tok.token_to_id(t) for t in EOS_CANDIDATES]
        found = [i for i in found if i is not None]
        # Without a special end token we fall back to id 0 as the brief says; it is then an
        # ordinary token too, so decode must not drop it.
        self.has_eos = bool(found)
        self.eos_id: int = found[0] if found else 0
        with open(self.path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        # The file's content, not its path, names the tokenizer: retraining in place changes it.
        self.identity = f"hf-{digest}"

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_of(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)  # parallel in Rust
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        arr = _as_ids(ids)
        if self.has_eos:
            arr = arr[arr != self.eos_id]
        return self._tok.decode(arr.tolist(), skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"HFTokenizer({self.path!r})"


def load_tokenizer(spec: str) -> ByteTokenizer | HFTokenizer:
    """`"byte"` -> ByteTokenizer; anything else is the path of a tokenizer.json."""
    if spec == "byte":
        return ByteTokenizer()
    from shoal.files import read_input_file  # the one check of a file a command reads

    path = os.path.expanduser(spec)
    if os.path.isdir(path):  # a model folder given for its tokenizer: name the file that is in it
        inside = os.path.join(path, "tokenizer.json")
        give = f"give {inside}" if os.path.isfile(inside) else "give the path of a Hugging Face tokenizer.json"
        raise UserError("data.tokenizer", spec, f'is a directory; {give} (or "byte")')
    if not read_input_file("data.tokenizer", path, '"byte" or the path of a Hugging Face tokenizer.json').strip():
        raise UserError("data.tokenizer", spec, 'is empty; give "byte" or the path of a Hugging Face tokenizer.json')
    try:
        return HFTokenizer(path)
    except Exception as e:  # tokenizers raises a bare Exception for a malformed file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError("data.tokenizer", spec,
                        f"not a readable tokenizers JSON file ({reason}); give \"byte\" or a tokenizer.json") from None
