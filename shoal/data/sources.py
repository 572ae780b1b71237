"""What a data path means: which files make up the corpus, and how to read documents from them.

`data.path` is one of:
  "stdlib"     the Python standard library's own .py source of the running interpreter
               (real text every machine has, no download), test suites excluded
  a file       plain text is one document; .jsonl/.ndjson is one document per line
  a glob       every matching file (a matching directory is walked like a directory)
  a directory  walked recursively for files with a text extension (TEXT_EXTENSIONS)

Listing stats every file and reads its first KiB, so that a broken link, an unreadable file, a
device or pipe, or a binary file (a NUL byte or invalid UTF-8 there) is refused up front, naming
the file, before any worker starts; `read_documents` reads them. Everything is sorted, so the same
files always give the same documents in the same order.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
import stat
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass

from shoal.errors import UserError

JSONL_EXTENSIONS = frozenset({".jsonl", ".ndjson"})
# Prose, markup and common source code: what a directory walk picks up. A file named
# explicitly (or matched by a glob) is read whatever its extension.
TEXT_EXTENSIONS = frozenset({
    ".txt", ".text", ".md", ".markdown", ".rst", ".tex", ".org", ".adoc",
    ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".js", ".ts",
    ".sh", ".html", ".css", ".toml", ".yaml", ".yml", ".csv", ".tsv",
}) | JSONL_EXTENSIONS

# Directories never worth reading: caches, VCS metadata, installed third-party packages.
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules"})
# The stdlib's test suites are left out: Debian and the official Docker images strip them, so
# without them one Python version gives the same corpus on every install.
STDLIB_SKIP_DIRS = SKIP_DIRS | {"test", "tests", "idle_test"}

STDLIB = "stdlib"
# How much of each file is looked at to tell text from binary: enough for any real text file to
# show itself, little enough that listing the whole stdlib costs milliseconds.
SNIFF_BYTES = 1024


@dataclass(frozen=True)
class Source:
    """One file of the corpus."""

    path: str
    """Absolute path."""
    name: str
    """Path relative to the corpus root: names documents the same on every machine (the val split hashes it)."""
    size: int
    mtime_ns: int
    text_field: str | None
    """The JSON field holding the text, for a JSONL file; None for a plain text file."""


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def list_documents(path: str, text_field: str = "text") -> list[Source]:
    """The files `path` names, sorted, as Sources. Raises UserError for a path that names nothing."""
    if path == STDLIB:
        root = stdlib_root()
        files = _walk(root, extensions=frozenset({".py"}), skip=STDLIB_SKIP_DIRS)
    else:
        files = _expand(path)
        # Names relative to the deepest common folder stay the same if the corpus moves.
        root = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
    sources = []
    for f in files:
        st = _check_file(f, path)
        is_jsonl = os.path.splitext(f)[1].lower() in JSONL_EXTENSIONS
        sources.append(Source(path=f, name=os.path.relpath(f, root), size=st.st_size,
                              mtime_ns=st.st_mtime_ns, text_field=text_field if is_jsonl else None))
    if all(s.size == 0 for s in sources):
        raise empty_corpus_error(path)
    return sources


def _check_file(file: str, path: str) -> os.stat_result:
    """A corpus file must exist, be a regular readable file, and look like UTF-8 text.

    A binary file is refused rather than skipped: training on a few stray executables or images
    is silently wrong, and a skip is easy to miss in a long log; the message names the file.
    """
    def refuse(problem: str, fix: str) -> UserError:
        return UserError("data.path", path, f"{file} {problem}; {fix}")

    try:
        st = os.stat(file)
    except FileNotFoundError:
        raise refuse("is a broken symbolic link (its target does not exist)", "remove it or fix the link") from None
    except OSError as e:
        raise refuse(f"cannot be read ({e.strerror})", "check its permissions") from None
    if not stat.S_ISREG(st.st_mode):  # a pipe or a device would block or never end
        raise refuse("is not a regular file", "point data.path at text files only")
    try:
        with open(file, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise refuse(f"cannot be read ({e.strerror})", "check its permissions or leave it out of data.path") from None
    if problem := binary_reason(head):
        raise refuse(f"is not text ({problem})", "remove it, convert it to UTF-8, or narrow data.path")
    return st


def binary_reason(head: bytes) -> str | None:
    """Why these first bytes of a file are not UTF-8 text, or None when they are."""
    if (nul := head.find(b"\0")) >= 0:
        return f"a NUL byte at offset {nul}"
    try:  # final=False: a character cut by the SNIFF_BYTES boundary is not an error
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 at offset {e.start}"
    return None


def empty_corpus_error(path: str) -> UserError:
    return UserError("data.path", path, "corpus is empty (every document has no text); point it at text files")


def _expand(path: str) -> list[str]:
    """A file, a glob or a directory -> sorted absolute file paths."""
    expanded = os.path.expanduser(path)
    if glob.has_magic(expanded):
        matches = sorted(glob.glob(expanded, recursive=True))
        if not matches:
            raise UserError("data.path", path, 'no such file: the glob matches nothing (or use "stdlib")')
    elif os.path.exists(expanded):
        matches = [expanded]
    else:
        raise UserError("data.path", path, 'no such file or directory (or use "stdlib" for the built-in corpus)')
    files: set[str] = set()
    for m in matches:
        if os.path.isdir(m):
            files.update(_walk(m, extensions=TEXT_EXTENSIONS, skip=SKIP_DIRS))
        elif os.path.isfile(m):
            files.add(os.path.abspath(m))
    if not files:
        exts = " ".join(sorted(TEXT_EXTENSIONS))
        raise UserError("data.path", path, f"no text files there (a directory is searched for {exts})")
    return sorted(files)


def _walk(root: str, extensions: frozenset[str], skip: frozenset[str]) -> list[str]:
    def unreadable(e: OSError):  # os.walk would silently leave the folder out of the corpus
        raise UserError("data.path", root, f"{e.filename} cannot be listed ({e.strerror}); check its permissions")

    out = []
    for d, dirs, names in os.walk(os.path.abspath(root), onerror=unreadable):
        dirs[:] = [x for x in dirs if x not in skip and not x.startswith(".")]  # .git, .venv, ...
        out += [os.path.join(d, n) for n in names
                if os.path.splitext(n)[1].lower() in extensions and not n.startswith(".")]
    return sorted(out)


def read_documents(source: Source) -> Iterator[tuple[str, str]]:
    """(document name, text) for each document in the file.

    Listing refused files whose first KiB is not UTF-8 text; a stray invalid byte further in
    becomes U+FFFD rather than failing a whole corpus, and NUL characters are dropped because
    token 0 separates documents in the byte tokenizer.
    """
    with open(source.path, "rb") as f:
        if source.text_field is None:
            yield source.name, _clean(f.read().decode("utf-8", errors="replace"))
            return
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"{source.path}:{lineno}"
            try:
                obj = json.loads(raw)
            except ValueError as e:
                raise UserError("data.path", where, f"not a JSON object on this line ({e})") from None
            if not isinstance(obj, dict) or source.text_field not in obj:
                keys = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
                raise UserError("data.text_field", source.text_field,
                                f"{where} has no such field (it has {keys}); set data.text_field")
            text = obj[source.text_field]
            if not isinstance(text, str):
                raise UserError("data.text_field", source.text_field,
                                f"{where}: the field is a {type(text).__name__}, not a string")
            yield f"{source.name}:{lineno}", _clean(text)


def _clean(text: str) -> str:
    return text.replace("\0", "") if "\0" in text else text
