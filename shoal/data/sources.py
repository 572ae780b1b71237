"""What a data path means: which files make up a corpus, in which format, checked before any work.

A data path (`data.path`, a `[data.mix]` key, or a `shoal data prepare` argument) is one of:
  "stdlib"     the Python standard library's own .py source of the running interpreter
               (real text every machine has, no download), test suites excluded
  a file       by its name: plain text is one document; .jsonl/.ndjson/.json is one document per
               line (a .json holding one array: one per element); .parquet and .arrow (a Hugging
               Face `save_to_disk` folder's files) one per row. Any of them may be compressed:
               .gz, .zst, .bz2, .xz
  a glob       every matching file (a matching directory is walked like a directory)
  a directory  walked recursively for the files above (TEXT_EXTENSIONS, COLUMNAR_EXTENSIONS and
               their compressed forms; not .json, which folders use for metadata)

Listing stats every file and opens it: a broken link, an unreadable file, a device or pipe, a
binary file where text belongs (a NUL byte or invalid UTF-8 in its first KiB, after decompression),
a damaged compressed file, or a table without the text field is refused up front, naming the file,
before any worker starts; readers.py then reads the documents. Everything is sorted, so the same
files always give the same documents in the same order.
"""

from __future__ import annotations

import glob
import os
import stat
import sysconfig

from shoal.data.readers import Source, sniff
from shoal.errors import UserError

JSONL_EXTENSIONS = frozenset({".jsonl", ".ndjson"})
# Prose, markup and common source code: what a directory walk picks up. A file named
# explicitly (or matched by a glob) is read whatever its extension.
TEXT_EXTENSIONS = frozenset({
    ".txt", ".text", ".md", ".markdown", ".rst", ".tex", ".org", ".adoc",
    ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".js", ".ts",
    ".sh", ".html", ".css", ".toml", ".yaml", ".yml", ".csv", ".tsv",
}) | JSONL_EXTENSIONS
COLUMNAR_EXTENSIONS = frozenset({".parquet", ".arrow"})
# Compression by suffix -> the codec readers.py opens it with; the suffix before it says the format.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}

# Directories never worth reading: caches, VCS metadata, installed third-party packages.
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages", "node_modules"})
# The stdlib's test suites are left out: Debian and the official Docker images strip them, so
# without them one Python version gives the same corpus on every install.
STDLIB_SKIP_DIRS = SKIP_DIRS | {"test", "tests", "idle_test"}

STDLIB = "stdlib"
DATASET_DICT = "dataset_dict.json"
"""What `datasets.DatasetDict.save_to_disk` writes beside its splits' folders."""


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def list_documents(path: str | list[str], text_field: str = "text", field: str = "data.path") -> list[Source]:
    """The files `path` (one data path or several) names, sorted, as checked Sources. Raises
    UserError naming `field` for a path that names nothing or a file that cannot be read."""
    paths = [path] if isinstance(path, str) else list(path)
    if paths == [STDLIB]:
        root = stdlib_root()
        given = {f: STDLIB for f in _walk(root, allowed=lambda n: n.endswith(".py"), skip=STDLIB_SKIP_DIRS, field=field)}
    else:
        if STDLIB in paths:
            raise UserError(field, STDLIB, "the built-in corpus cannot be combined with other paths; give it alone")
        given = {f: p for p in reversed(paths) for f in _expand(p, field)}  # a file named twice: the first
        # Names relative to the deepest common folder stay the same if the corpus moves.
        root = os.path.commonpath(list(given)) if len(given) > 1 else os.path.dirname(next(iter(given)))
    sources = [_source(f, os.path.relpath(f, root), text_field, field, given[f]) for f in sorted(given)]
    if all(s.size == 0 for s in sources):
        raise empty_corpus_error(field, " ".join(paths))
    return sources


def kind_of(file: str) -> tuple[str, str]:
    """(kind, compression) from a file's name: data.jsonl.gz -> ("jsonl", "gzip")."""
    stem, ext = os.path.splitext(file.lower())
    compression = COMPRESSIONS.get(ext, "")
    if compression:
        ext = os.path.splitext(stem)[1]
    if ext in JSONL_EXTENSIONS or ext == ".json":
        return "jsonl", compression
    if ext in COLUMNAR_EXTENSIONS:
        return ext[1:], compression
    return "text", compression


def walkable(name: str) -> bool:
    """Whether a directory walk reads this file: text, JSONL, columnar, or any of them compressed."""
    stem, ext = os.path.splitext(name.lower())
    if ext in COMPRESSIONS:
        ext = os.path.splitext(stem)[1]
    return ext in TEXT_EXTENSIONS or ext in COLUMNAR_EXTENSIONS


def _source(file: str, name: str, text_field: str, field: str, given: str) -> Source:
    """A corpus file must exist, be a regular readable file, and hold what its name says.

    A binary file is refused rather than skipped: training on a few stray executables or images
    is silently wrong, and a skip is easy to miss in a long log; the message names the file.
    """
    def refuse(problem: str, fix: str) -> UserError:
        return UserError(field, given, f"{file} {problem}; {fix}")

    try:
        st = os.stat(file)
    except FileNotFoundError:
        raise refuse("is a broken symbolic link (its target does not exist)", "remove it or fix the link") from None
    except OSError as e:
        raise refuse(f"cannot be read ({e.strerror})", "check its permissions") from None
    if not stat.S_ISREG(st.st_mode):  # a pipe or a device would block or never end
        raise refuse("is not a regular file", "point the data path at data files only")
    if _undecodable(name):  # documents are named (and the held-out split hashed) by the name, as UTF-8 text
        raise refuse("has a name that is not UTF-8 text", "rename it (e.g. convmv -f latin1 -t utf8)")
    kind, compression = kind_of(file)
    source = Source(path=file, name=name, size=st.st_size, mtime_ns=st.st_mtime_ns, kind=kind,
                    compression=compression, text_field=None if kind == "text" else text_field, given=given)
    sniff(source, field)
    return source


def _undecodable(name: str) -> bool:
    """Bytes of a file name that were not UTF-8, which Python keeps as lone surrogates."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def empty_corpus_error(field: str, path: str) -> UserError:
    return UserError(field, path, "corpus is empty (every document has no text); point it at text files")


def _expand(path: str, field: str) -> list[str]:
    """A file, a glob or a directory -> sorted absolute file paths."""
    expanded = os.path.expanduser(path)
    if glob.has_magic(expanded):
        matches = sorted(glob.glob(expanded, recursive=True))
        if not matches:
            raise UserError(field, path, 'no such file: the glob matches nothing (or use "stdlib")')
    elif os.path.exists(expanded):
        matches = [expanded]
    else:
        raise UserError(field, path, 'no such file or directory (or use "stdlib" for the built-in corpus)')
    files: set[str] = set()
    for m in matches:
        if os.path.isfile(os.path.join(m, DATASET_DICT)):  # a walk would mix its splits, test into train
            splits = sorted(d for d in os.listdir(m) if os.path.isdir(os.path.join(m, d)))
            raise UserError(field, path, f"{m} is a Hugging Face DatasetDict with the splits {', '.join(splits)}; "
                                         f"give one split's folder, e.g. {os.path.join(path, splits[0] if splits else 'train')}")
        if os.path.isdir(m):
            files.update(_walk(m, allowed=walkable, skip=SKIP_DIRS, field=field))
        elif os.path.isfile(m):
            files.add(os.path.abspath(m))
    if not files:
        exts = " ".join(sorted(TEXT_EXTENSIONS | COLUMNAR_EXTENSIONS))
        raise UserError(field, path, f"no text or data files there (a directory is searched for {exts}, "
                                     f"also compressed: {' '.join(COMPRESSIONS)})")
    return sorted(files)


def _walk(root: str, allowed, skip: frozenset[str], field: str) -> list[str]:
    def unreadable(e: OSError):  # os.walk would silently leave the folder out of the corpus
        raise UserError(field, root, f"{e.filename} cannot be listed ({e.strerror}); check its permissions")

    out = []
    for d, dirs, names in os.walk(os.path.abspath(root), onerror=unreadable):
        dirs[:] = [x for x in dirs if x not in skip and not x.startswith(".")]  # .git, .venv, ...
        out += [os.path.join(d, n) for n in names if allowed(n) and not n.startswith(".")]
    return sorted(out)
