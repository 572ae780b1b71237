"""Documents out of one corpus file, whatever its format (sources.py decides the format by name).

    text      the whole file is one document, named by the file
    jsonl     one per line: `obj[text_field]`, named file:line
    json      a .json holding one array instead of lines: one per element, named file:index
              (a JSON record without the text field but with "prompt" and "completion", or with
              "messages", is a fine-tuning example: see Example and Chat)
    parquet   one per row of the text column (pyarrow, batch by batch), named file:row
    arrow     the same for Arrow IPC files, stream or file format (what `datasets.save_to_disk` writes)

Compressed files (.gz, .zst, .bz2, .xz) are read through their codec as a stream, never whole.
`sniff` opens a file the way `read_documents` will and reads its start, so that a damaged archive,
binary data where text belongs or a table without the text field is one line before any work;
damage further in is the same one line when reading reaches it. Invalid UTF-8 past the sniffed
start becomes U+FFFD rather than failing a whole corpus (in a JSON record too), and so does a lone
surrogate that a JSON escape (\\ud800) gives; NUL characters are dropped because token 0 separates
documents in the byte tokenizer.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import json
import lzma
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from shoal.errors import UserError, first_line

ROWS_PER_BATCH = 1024
# How much of each file is looked at to tell text from binary: enough for any real text file to
# show itself, little enough that listing the whole stdlib costs milliseconds.
SNIFF_BYTES = 1024
# What a damaged compressed stream raises, by codec: caught so the file is named in one line.
_CODEC_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


@dataclass(frozen=True)
class Source:
    """One file of the corpus."""

    path: str
    """Absolute path."""
    name: str
    """Path relative to the corpus root: names documents the same on every machine (the val split hashes it)."""
    size: int
    mtime_ns: int
    kind: str
    """text (the file is one document), jsonl (one per line), json (one per element of an array),
    parquet or arrow (one per row)."""
    compression: str = ""
    """"", or a COMPRESSIONS codec."""
    text_field: str | None = None
    """The field holding the text, for every kind but text."""
    given: str = ""
    """The data path it was found under, as the user wrote it (messages name both)."""


def binary_reason(head: bytes) -> str | None:
    """Why these first bytes of a file are not UTF-8 text, or None when they are."""
    if (nul := head.find(b"\0")) >= 0:
        return f"a NUL byte at offset {nul}"
    try:  # final=False: a character cut by the SNIFF_BYTES boundary is not an error
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 at offset {e.start}"
    return None


def sniff(source: Source, field: str = "data.path") -> None:
    """Refuse a file that cannot be read as its name says, naming it (see the module doc)."""
    if source.kind in ("parquet", "arrow"):
        with _reading(source, field):
            _text_column(source, _open_table(source), field)
        return
    with _reading(source, field), _open(source) as f:
        head = f.read(SNIFF_BYTES)
    if problem := binary_reason(head):
        what = f"{source.compression} data" if source.compression else "text"
        raise UserError(field, source.given, f"{source.path} is not {what} ({problem}); remove it, convert it to "
                                             "UTF-8 text, or narrow the data path")


def read_documents(source: Source, field: str = "data.path") -> Iterator[tuple[str, str | Example | Chat]]:
    """(document name, text) for each document in the file, in order; a JSONL record may give a
    fine-tuning Example or Chat instead of text."""
    with _reading(source, field):
        if source.kind in ("parquet", "arrow"):
            yield from _rows(source, field)
            return
        with _open(source) as f:
            if source.kind == "text":
                yield source.name, _clean(f.read().decode("utf-8", errors="replace"))
                return
            if _starts_an_array(f):  # a .json array rather than lines
                yield from _array(source, f.read(), field)
                return
            for lineno, raw in enumerate(f, start=1):
                if raw.strip():
                    where = f"{source.path}:{lineno}"
                    try:
                        obj = json.loads(_decoded(raw))
                    except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's limit
                        raise UserError(field, where, f"not a JSON object on this line ({e}); fix or remove the "
                                                      "line") from None
                    yield f"{source.name}:{lineno}", _field(obj, source, where)


@contextmanager
def _reading(source: Source, field: str):
    """Damage found while opening or reading a file is one line naming it (UserErrors pass through)."""
    try:
        yield
    except UserError:
        raise
    except ImportError as e:
        raise UserError(field, source.given, f"{source.path} needs the {e.name} package to read {source.kind}"
                                            f"{' ' + source.compression if source.compression else ''} files; "
                                            "pip install 'shoal[data]'") from None
    except _CODEC_ERRORS + _arrow_errors() as e:
        what = f"{source.compression} {source.kind}" if source.compression else source.kind
        raise UserError(field, source.given, f"{source.path} is not a readable {what} file ({first_line(e)}); it "
                                             "is damaged or misnamed: replace it or leave it out") from None


def _arrow_errors() -> tuple[type, ...]:
    try:
        import pyarrow
    except ImportError:
        return ()
    return (pyarrow.ArrowException,)


def _open(source: Source) -> io.BufferedReader:
    raw = open(source.path, "rb")
    if source.compression == "gzip":
        return io.BufferedReader(gzip.GzipFile(fileobj=raw))
    if source.compression == "bz2":
        return io.BufferedReader(bz2.BZ2File(raw))
    if source.compression == "xz":
        return io.BufferedReader(lzma.LZMAFile(raw))
    if source.compression == "zstd":
        return io.BufferedReader(_ZstdFrames(raw))
    return raw


class _ZstdFrames(io.RawIOBase):
    """A .zst file's frames decompressed one after another. A file that ends inside a frame raises
    EOFError, as gzip's reader does (zstandard's own stream_reader ends there quietly, and a cut file
    was tokenized as a shorter one, or as none at all); damaged data raises ValueError."""

    def __init__(self, raw):
        import zstandard

        self.raw, self.new_frame, self.damage = raw, zstandard.ZstdDecompressor().decompressobj, zstandard.ZstdError
        self.frame, self.in_frame, self.unused = self.new_frame(), False, b""
        self.pending, self.at = b"", 0  # decompressed bytes not yet read, and how many of them were

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self.at == len(self.pending):
            compressed, self.unused = self.unused or self.raw.read(1 << 16), b""
            if not compressed:
                if self.in_frame:
                    raise EOFError("the zstd stream ends inside a frame: the file was cut short")
                return 0
            try:
                self.pending, self.at, self.in_frame = self.frame.decompress(compressed), 0, True
            except self.damage as e:  # as a ValueError, one of the _CODEC_ERRORS that name the file
                raise ValueError(first_line(e)) from None
            if self.frame.eof:  # the next frame, if any, starts in what this one left over
                self.unused, self.frame, self.in_frame = self.frame.unused_data, self.new_frame(), False
        n = min(len(buffer), len(self.pending) - self.at)
        buffer[:n] = memoryview(self.pending)[self.at:self.at + n]
        self.at += n
        return n

    def close(self) -> None:
        self.raw.close()
        super().close()


def _open_table(source: Source):
    """A pyarrow reader with `.schema` and `.iter_batches(columns)` for a parquet or Arrow IPC file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if source.compression:
        raise UserError("data.path", source.given, f"{source.path}: {source.kind} files compress inside; give the "
                                                   "file uncompressed")
    if source.kind == "parquet":
        return pq.ParquetFile(source.path)
    try:  # datasets' save_to_disk writes the stream format; pyarrow's own writers the file format
        return _IpcTable(pa.ipc.open_stream(pa.memory_map(source.path)))
    except pa.ArrowInvalid:
        return _IpcTable(pa.ipc.open_file(pa.memory_map(source.path)))


class _IpcTable:
    """An Arrow IPC reader with the parquet reader's two members."""

    def __init__(self, reader):
        self.reader, self.schema = reader, reader.schema

    def iter_batches(self, columns: list[str], batch_size: int):
        batches = (self.reader.get_batch(i) for i in range(self.reader.num_record_batches)) \
            if hasattr(self.reader, "num_record_batches") else self.reader
        for batch in batches:
            yield batch.select(columns)


def _text_column(source: Source, table, field: str) -> None:
    import pyarrow as pa

    schema = getattr(table, "schema_arrow", table.schema)  # a ParquetFile's .schema is parquet's own
    names = list(schema.names)
    if source.text_field not in names:
        raise UserError("data.text_field", source.text_field, f"{source.path} has no such column (it has "
                                                              f"{names[:8]}); set data.text_field (--text-field)")
    kind = schema.field(source.text_field).type
    if pa.types.is_dictionary(kind):  # pandas writes a categorical column so; its values read as strings
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise UserError("data.text_field", source.text_field, f"{source.path}: the column holds {kind}, not "
                                                              "strings; name the text column")


def _rows(source: Source, field: str) -> Iterator[tuple[str, str]]:
    table = _open_table(source)
    _text_column(source, table, field)
    row = 0
    for batch in table.iter_batches(columns=[source.text_field], batch_size=ROWS_PER_BATCH):
        for text in batch.column(0).to_pylist():
            row += 1
            if text:  # a null is an empty document
                yield f"{source.name}:{row}", _clean(text)


def _starts_an_array(f: io.BufferedReader) -> bool:
    """Whether a JSON file holds one array: its first character, past a byte order mark and
    whitespace (a pretty-printer's leading newline), is '['."""
    head = f.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(f, "peek") else b""
    return head.removeprefix(codecs.BOM_UTF8).lstrip()[:1] == b"["


def _array(source: Source, raw: bytes, field: str) -> Iterator[tuple[str, str]]:
    try:
        items = json.loads(_decoded(raw))
    except (ValueError, RecursionError) as e:
        raise UserError(field, source.given, f"{source.path} starts like a JSON array but is not one ({e}); write "
                                             "one JSON object per line") from None
    for i, obj in enumerate(items):
        yield f"{source.name}:{i}", _field(obj, source, f"{source.path}[{i}]")


@dataclass(frozen=True)
class Example:
    """A fine-tuning example: text segments, each trained on (its tokens are targets of the loss) or not.
    A record {"prompt": ..., "completion": ...} is one; chat.py renders {"messages": [...]} into one."""

    segments: tuple[tuple[str, bool], ...]


@dataclass(frozen=True)
class Chat:
    """A record {"messages": [{"role": ..., "content": ...}, ...]}, for the tokenizer's chat template."""

    messages: tuple[dict, ...]


def _field(obj: object, source: Source, where: str) -> str | Example | Chat:
    """A JSON record's document: its text field, or a fine-tuning example (prompt and completion, or
    chat messages) when it has those instead."""
    if isinstance(obj, dict) and source.text_field not in obj:
        if isinstance(obj.get("prompt"), str) and isinstance(obj.get("completion"), str):
            return Example(((_clean(obj["prompt"]), False), (_clean(obj["completion"]), True)))
        if "prompt" in obj and "completion" in obj:  # the message below would say to give what is there
            raise UserError("data.path", where, "prompt and completion must both be strings; fix the record")
        if "messages" in obj:
            return Chat(_messages(obj["messages"], where))
    if not isinstance(obj, dict) or source.text_field not in obj:
        keys = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
        raise UserError("data.text_field", source.text_field,
                        f"{where} has no such field (it has {keys}); set data.text_field, or give fine-tuning "
                        "records as prompt and completion, or as messages")
    text = obj[source.text_field]
    if text is None:  # what pandas and datasets write for a missing value; a table's null row reads the same
        return ""
    if not isinstance(text, str):
        raise UserError("data.text_field", source.text_field,
                        f"{where}: the field is a {type(text).__name__}, not a string")
    return _clean(text)


def _messages(messages: object, where: str) -> tuple[dict, ...]:
    ok = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    if not ok:
        raise UserError("data.path", where, 'messages must be a list of {"role": ..., "content": ...} with string '
                                            "values; fix the record")
    return tuple({"role": m["role"], "content": _clean(m["content"])} for m in messages)


def _decoded(raw: bytes) -> str:
    """JSON bytes as text the way a text file is read: a byte order mark dropped, invalid UTF-8 as U+FFFD.
    json.loads of the bytes refused the whole record, and so the corpus, for one stray byte."""
    return raw.decode("utf-8-sig", errors="replace")


# What JSON's \ud800-\udfff escapes give when unpaired (truncated emoji in scraped text): not text that
# UTF-8 can encode, so the tokenizers library refused the whole batch with a TypeError.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    if "\0" in text:
        text = text.replace("\0", "")
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)  # isascii is O(1)
