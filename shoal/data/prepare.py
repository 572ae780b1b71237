"""Tokenize a corpus into a prepared dataset (dataset.py), file by file, on every core.

Each input file becomes one shard, tokenized by one worker process; the `tokenizers` library's
own threads split the cores left over when there are fewer files than workers. What is already
done is kept: a shard whose input file has the same size and modification time, and whose own
files still match its checksum, is not tokenized again, so an interrupted run resumes and an
edited corpus redoes only the files that changed.

`--shard I/N` splits the files between N machines sharing the folder: part I takes every N-th
file, writes its shards and parts/I-of-N.json, and whichever part finishes last writes the
manifest over all of them.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from shoal.data import dataset as ds
from shoal.data.readers import Source
from shoal.data.sources import empty_corpus_error, list_documents
from shoal.data.tokenize_file import tokenize_file
from shoal.errors import UserError, first_line
from shoal.files import missing_parts, write_json

# Below this much input, tokenizing in this process beats starting worker processes (workers=0).
IN_PROCESS_BYTES = 32 << 20
PREPARE_STATE = "prepare.json"


@dataclass
class Prepared:
    path: str
    shards_done: int
    """Shards tokenized by this call (the others were already done)."""
    shards_kept: int
    complete: bool
    """False for a part of a --shard split whose other parts are not finished yet."""
    seconds: float
    input_bytes: int


def prepare(inputs: list[str], tokenizer_spec: str, out: str, *, text_field: str = "text",
            val_fraction: float = 0.01, workers: int = 0, part: tuple[int, int] = (0, 1),
            show: bool = True, field: str = "data.path", out_field: str = "--out") -> Prepared:
    """Tokenize `inputs` (data paths, see sources.py) into the dataset folder `out`. `field` and
    `out_field` are what messages call the inputs and the folder."""
    from shoal.data.tokenizer import EOS_CANDIDATES, load_tokenizer

    t0 = time.perf_counter()
    if not 0 < val_fraction < 1:
        raise UserError("--val-fraction", val_fraction, "must be in (0, 1), e.g. 0.01 holds out 1% of documents")
    tokenizer = load_tokenizer(tokenizer_spec)
    settings = ds.Settings(tokenizer=tokenizer.identity, vocab_size=tokenizer.vocab_size, eos_id=tokenizer.eos_id,
                           dtype=ds.token_dtype(tokenizer.vocab_size).str, text_field=text_field,
                           val_fraction=val_fraction)
    sources = list_documents(inputs, text_field, field)
    with _claimed(out, settings, out_field) as directory:
        index, count = part
        mine = sources[index::count]
        for s in mine:  # a folder where a shard's file belongs cannot be replaced: no retry helps
            if any(os.path.isdir(p) for p in ds.shard_paths(directory, ds.shard_key(s.name))):
                raise UserError(out_field, out, f"{ds.shard_paths(directory, ds.shard_key(s.name))[0]} (or its "
                                                ".docs or .json) is a folder where a shard's file belongs; remove it")
        kept = {s.name: r for s in mine if (r := _reusable(directory, s, settings)) is not None}
        todo = [s for s in mine if s.name not in kept]
        records = dict(kept)
        if todo and not getattr(tokenizer, "has_eos", True):  # said when tokenizing, not on every reuse
            print(f"shoal: warning: {tokenizer_spec} defines no end-of-text token ({', '.join(EOS_CANDIDATES)}), so "
                  f"id 0 ({tokenizer.token_of(0)!r}, an ordinary token of it) separates documents", file=sys.stderr,
                  flush=True)
        if todo:
            for record in _tokenize_all(todo, tokenizer_spec, directory, settings, workers, show, field):
                records[record.source] = record
        ordered = [records[s.name] for s in mine]
        if count == 1 and not any(r.tokens for r in ordered):  # files with bytes, and no text in them (null rows)
            _remove_stale(directory, set())  # empty shards are nothing to resume from: the claim can be taken back
            raise empty_corpus_error(field, " ".join(inputs))
        if count == 1:
            _remove_stale(directory, {r.key for r in ordered})
            _publish(directory, settings, ordered, tokenizer_spec)
            complete = True
        else:
            write_json(os.path.join(directory, ds.PARTS, f"{index}-of-{count}.json"),
                       {"files": len(sources), "shards": [asdict(r) for r in ordered]})
            complete = _merge_parts(directory, settings, count, len(sources), tokenizer_spec)
        return Prepared(directory, len(todo), len(kept), complete, time.perf_counter() - t0,
                        sum(s.size for s in todo))


@contextlib.contextmanager
def _claimed(out: str, settings: ds.Settings, out_field: str) -> Iterator[str]:
    """_claim's folder, for the work inside. A refusal there (a bad line, a missing field) in a folder
    this call claimed first takes back what the claim wrote, unless a shard got in: no half-made folder
    stays, and trying again with other settings, as the refusal may ask, is not refused as a "dataset
    prepared with other settings"."""
    path = Path(out).expanduser().absolute()
    made, first = missing_parts(path), not (path / PREPARE_STATE).exists()
    directory = _claim(out, settings, out_field)
    try:
        yield directory
    except UserError:
        if first:
            with contextlib.suppress(OSError):  # rmdir takes empty folders only: a shard or a part stops it
                os.rmdir(path / ds.SHARDS)
                os.rmdir(path / ds.PARTS)
                os.remove(path / PREPARE_STATE)
                for folder in made:
                    folder.rmdir()
        raise


def _claim(out: str, settings: ds.Settings, out_field: str) -> str:
    """Create or reopen the dataset folder. A folder that holds something else, or a dataset made
    with other settings, is refused: redoing it would destroy what is there."""
    directory = os.path.abspath(os.path.expanduser(out))
    state = os.path.join(directory, PREPARE_STATE)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UserError(out_field, out, "is a file; give a folder for the dataset")
    if os.path.isdir(directory) and os.listdir(directory) and not os.path.exists(state):
        raise UserError(out_field, out, "is a folder that holds something other than a prepared dataset; "
                                      "give a new or empty folder")
    try:
        os.makedirs(os.path.join(directory, ds.SHARDS), exist_ok=True)
        os.makedirs(os.path.join(directory, ds.PARTS), exist_ok=True)
    except OSError as e:
        raise UserError(out_field, out, f"cannot be created ({e.strerror}); give a writable folder") from None
    wanted = asdict(settings)
    if os.path.exists(state):
        had = _recorded_settings(state, out, out_field)
        if had != wanted:
            changed = ", ".join(f"{k} {had.get(k)!r} -> {v!r}" for k, v in wanted.items() if had.get(k) != v)
            raise UserError(out_field, out, f"holds a dataset prepared with other settings ({changed}); give "
                                          "another folder, or remove this one to prepare it again")
    else:
        write_json(state, wanted)
    return directory


def _recorded_settings(state: str, out: str, out_field: str) -> dict:
    """The settings prepare.json says the folder's shards were made with. Damaged, how they were made is
    unknown, so none can be kept: refused, rather than mixed with shards made otherwise."""
    try:
        with open(state, "rb") as f:
            had = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:  # a folder or unreadable; not UTF-8 or not JSON
        had = e
    if not isinstance(had, dict):
        why = first_line(had) if isinstance(had, Exception) else f"a JSON {type(had).__name__}, not a table"
        raise UserError(out_field, out, f"holds a damaged {PREPARE_STATE} ({why}); remove the folder to prepare it "
                                        "again, or give another")
    return had


def _reusable(directory: str, source: Source, settings: ds.Settings) -> ds.ShardRecord | None:
    """The shard already made from this unchanged file, if it is intact."""
    key = ds.shard_key(source.name)
    record = ds.read_record(directory, key)
    if record is None or (record.source, record.source_size, record.source_mtime_ns) != (
            source.name, source.size, source.mtime_ns):
        return None
    problem = ds.shard_problem(directory, record, np.dtype(settings.dtype).itemsize)
    if problem:  # a crash mid-copy, a full disk, a hand edit: tokenized again
        print(f"shoal: shard {ds.shard_paths(directory, key)[0]} {problem}; tokenizing {source.path} again",
              file=sys.stderr, flush=True)
    return None if problem else record


def _tokenize_all(todo: list[Source], tokenizer_spec: str, directory: str, settings: ds.Settings,
                  workers: int, show: bool, field: str) -> Iterator[ds.ShardRecord]:
    total = sum(s.size for s in todo)
    if not workers:  # automatic: every core, unless starting processes would cost more than it saves
        workers = 1 if total < IN_PROCESS_BYTES else os.cpu_count() or 1
    workers = min(workers, len(todo))
    progress = _Progress(total, len(todo), workers, show)
    try:
        if workers == 1:
            for s in todo:
                yield tokenize_file(s, tokenizer_spec, directory, settings, field)
                progress.advance(s.size)
            return
        # spawn: workers start clean (no torch, no threads copied from this process) and each loads
        # the tokenizer itself; biggest files first, so one large file does not finish last alone.
        threads = max(1, (os.cpu_count() or 1) // workers)
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker_threads,
                                 initargs=(threads,)) as pool:
            pending = {pool.submit(tokenize_file, s, tokenizer_spec, directory, settings, field): s
                       for s in sorted(todo, key=lambda s: -s.size)}
            try:
                while pending:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for future in done:
                        source = pending.pop(future)
                        yield future.result()  # a worker's UserError is raised here, naming its file
                        progress.advance(source.size)
            except BrokenProcessPool:  # killed from outside (the OOM killer, a signal): what is done stays
                raise UserError("--workers", workers, "a tokenizing process died (out of memory, or killed); run "
                                                      "again with fewer workers: finished files are kept") from None
            except BaseException:  # one file's error ends the work now: the others' files could take minutes
                for future in pending:
                    future.cancel()
                for pid, process in getattr(pool, "_processes", {}).items():  # public only from Python 3.14 on
                    process.terminate()
                    process.join()
                    for tmp in glob.glob(os.path.join(directory, ds.SHARDS, f"*.{pid}.tmp")):
                        os.remove(tmp)  # what it was writing (its own clean-up did not run)
                raise
    finally:
        progress.close()


def _worker_threads(threads: int) -> None:
    # Read by the tokenizers library (Rust's rayon) when it first encodes a batch in this process.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"


def _publish(directory: str, settings: ds.Settings, records: list[ds.ShardRecord], tokenizer_spec: str) -> None:
    from shoal.data.tokenizer_files import copy_tokenizer

    recorded = copy_tokenizer(tokenizer_spec, Path(directory))
    ds.write_manifest(directory, settings, records, None if recorded == "byte" else recorded)


def _merge_parts(directory: str, settings: ds.Settings, count: int, files: int, tokenizer_spec: str) -> bool:
    """Write the manifest once all `count` parts are written for the same corpus; False until then."""
    records = []
    for i in range(count):
        name = f"{i}-of-{count}.json"
        try:
            with open(os.path.join(directory, ds.PARTS, name)) as f:
                part = json.load(f)
            seen, shards = part["files"], [ds.from_json(ds.ShardRecord, r) for r in part["shards"]]
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError) as e:  # a part written by hand, cut, or not JSON
            raise UserError("--shard", f"{i}/{count}", f"{ds.PARTS}/{name} is damaged ({first_line(e)}); run part "
                                                       f"{i}/{count} again: its finished files are kept") from None
        if seen != files:
            raise UserError("--shard", f"{i}/{count}", f"part {i} saw {seen} input files where this part "
                                                       f"sees {files}: the parts were given different inputs")
        records += shards
    records.sort(key=lambda r: r.source)
    _publish(directory, settings, records, tokenizer_spec)
    return True


def _remove_stale(directory: str, keys: set[str]) -> None:
    """Shards of files no longer in the corpus."""
    for name in os.listdir(os.path.join(directory, ds.SHARDS)):
        key = name.rsplit(".", 1)[0]
        if key not in keys:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, ds.SHARDS, name))


class _Progress:
    """Input MB done, MB/s and time left: a rich bar on a terminal, a line every 10 s otherwise."""

    def __init__(self, total_bytes: int, files: int, workers: int, show: bool):
        self.total, self.done, self.t0, self.last = total_bytes, 0, time.perf_counter(), time.perf_counter()
        self.bar = None
        self.show = show and total_bytes >= IN_PROCESS_BYTES  # small corpora finish before a bar helps
        if not self.show:
            return
        print(f"shoal: tokenizing {files} files ({total_bytes / 1e6:,.1f} MB) with {workers} worker"
              f"{'s' if workers > 1 else ''}", file=sys.stderr, flush=True)
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TimeRemainingColumn,
                                       TransferSpeedColumn)

            self.bar = Progress(BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                console=Console(stderr=True))
            self.task = self.bar.add_task("tokenize", total=total_bytes)
            self.bar.start()

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)
        elif self.show and (time.perf_counter() - self.last > 10 or self.done == self.total):
            self.last = now = time.perf_counter()
            rate = self.done / max(now - self.t0, 1e-9)
            left = (self.total - self.done) / max(rate, 1e-9)
            print(f"shoal: {self.done / 1e6:,.0f}/{self.total / 1e6:,.0f} MB, {rate / 1e6:.1f} MB/s, "
                  f"{left:.0f} s left", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
