"""Checkpoints on disk: atomic commit, a manifest of sizes and checksums, discovery and retention.

    <root>/                       checkpoint.dir, or <out>/checkpoints
      step_00000020/              a committed checkpoint: a directory appears under this name only whole
        .metadata                 DCP index (rank 0)
        __0_0.distcp, __1_0...    DCP shards, one file per rank
        train_state.json          step, data position, config, layout, RNG-free extras (rank 0)
        manifest.json             every file above with its size and checksum (XXH3-128); written last
      .partial-step_00000030/     a save in progress, or one a crash interrupted (removed at the next start)

A save writes everything under the .partial- name; once every rank's shard is written and hashed
(as it is written: hashing_writer.py),
rank 0 writes the manifest and renames the directory (an atomic rename on POSIX file systems).
Loading checks the manifest and every file's size and checksum, and falls back to the previous
checkpoint when the newest is damaged. The tensor shards (.distcp) may be hashed while they are
read instead of before (data_checksums=False here, then verify_share): the checkpointer checks the
hashes before it applies anything it read.

Paths: shoal only discovers, loads or deletes direct children of the root with these names that
are real directories (not symlinks) inside the root (shoal/rundir/names.py), and every file a
checkpoint refers to must be a plain name inside its own directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from shoal.files import write_json
from shoal.rundir.names import MANIFEST, inside, list_checkpoints, step_of_dir

FORMAT = "shoal-checkpoint/1"
TRAIN_STATE = "train_state.json"
PARTIAL = ".partial-"
DATA_SUFFIX = ".distcp"
"""DCP's tensor shards: nearly all of a checkpoint's bytes."""


def warn(message: str) -> None:
    print(f"shoal: {message}", file=sys.stderr, flush=True)


HASH = "xxh3_128"
"""The checksum new manifests record: XXH3-128 hashes 20+ GB/s on one core (SHA-256: about 2), so
verifying every byte costs a small part of reading it. It guards against damage (a torn write, a
flipped bit, a truncated copy), which is what the manifest is for; a forger who can write the
checkpoint can rewrite the manifest too, whatever the hash."""
HASHES = {"sha256": (hashlib.sha256, 64), "xxh3_128": (xxhash.xxh3_128, 32)}
"""Algorithm -> (constructor, hex digits). The manifest names its algorithm ("hash"; none: sha256,
what shoal wrote before), so older checkpoints stay readable."""
_CHUNK = 8 << 20


def hasher(algorithm: str = HASH):
    return HASHES[algorithm][0]()


def digest(path: Path, algorithm: str = HASH) -> dict:
    """Size and checksum of one file, read in chunks into one buffer (both hashes release the GIL,
    so threads hash files in parallel)."""
    h, buffer = hasher(algorithm), bytearray(_CHUNK)
    view, size = memoryview(buffer), 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            h.update(view[:n])
            size += n
    return {"bytes": size, algorithm: h.hexdigest()}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(partial: Path, final: Path, files: dict[str, dict], info: dict) -> None:
    """Make `partial` the checkpoint `final`: write the manifest last, then rename atomically."""
    write_json(partial / MANIFEST, {"format": FORMAT, "complete": True, "hash": HASH, **info, "files": files})
    _fsync_dir(partial)
    if final.exists():  # the same step saved again (e.g. a resumed run): replace it as a whole
        old = final.with_name(PARTIAL + final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(partial, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(partial, final)
    _fsync_dir(final.parent)


class Damaged(ValueError):
    """A checkpoint file that is unreadable or not the shape shoal writes."""


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        raise Damaged(f"{path} is unreadable or not JSON ({type(e).__name__})") from None


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def read_manifest(directory: Path) -> dict:
    """manifest.json, its shape checked: {"format", "complete": true, "hash": algorithm,
    "files": {name: {"bytes", <algorithm>}}} (no "hash": sha256)."""
    path = directory / MANIFEST
    manifest = _read_json(path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("complete") is not True:
        raise Damaged(f"{path} is not a complete {FORMAT} manifest")
    algorithm = manifest.setdefault("hash", "sha256")
    if not isinstance(algorithm, str) or algorithm not in HASHES:
        raise Damaged(f"{path} names the hash {str(algorithm)[:40]!r}; shoal knows {', '.join(HASHES)}")
    files, hex_digits = manifest.get("files"), HASHES[algorithm][1]
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and _is_int(v.get("bytes")) and v["bytes"] >= 0
            and isinstance(v.get(algorithm), str) and len(v[algorithm]) == hex_digits for v in files.values()):
        raise Damaged(f'{path} does not list its files as {{name: {{"bytes": int, "{algorithm}": hex}}}}')
    return manifest


# train_state.json: field -> (what it must be, a check). Everything resume and `ckpt inspect` read.
_LAYOUT_INTS = ("world_size", "dp_replicate", "dp_shard", "tp", "pp", "ep", "zero")
_TRAIN_STATE = {
    "step": ("an integer >= 0", lambda v: _is_int(v) and v >= 0),
    "data": ('{"step": int, ...}', lambda v: isinstance(v, dict) and _is_int(v.get("step")) and v["step"] >= 0),
    "model": ("a table of model fields", lambda v: isinstance(v, dict)),
    "layout": ("a table of layout integers", lambda v: isinstance(v, dict) and all(
        _is_int(v[k]) for k in _LAYOUT_INTS if k in v) and isinstance(v.get("pp_schedule"), (str, type(None)))),
    "loss": ("a number or null", lambda v: v is None or _is_number(v)),
}
LATEST_TIME = 1e11
"""The latest saving time train_state.json may hold (the year 5138): `ckpt inspect` dates it, and a
later one (or NaN) is a damaged number no date can be made of."""
_TRAIN_STATE_OPTIONAL = {  # resume and export read config.data's path and tokenizer
    "time": ("seconds since 1970", lambda v: _is_number(v) and 0 <= v <= LATEST_TIME),
    "config": ('a table with a "data" table', lambda v: isinstance(v, dict) and isinstance(v.get("data", {}), dict)),
}


def read_train_state(directory: Path) -> dict:
    """train_state.json, every field resume and `ckpt inspect` use checked for its type."""
    path = directory / TRAIN_STATE
    state = _read_json(path)
    if not isinstance(state, dict):
        raise Damaged(f"{path} holds a JSON {type(state).__name__}, not an object")
    for key, (what, ok) in _TRAIN_STATE.items():
        if key not in state or not ok(state[key]):
            raise Damaged(f"{path}: {key!r} is {'missing' if key not in state else repr(state[key])[:40]}, "
                          f"expected {what}")
    for key, (what, ok) in _TRAIN_STATE_OPTIONAL.items():
        if key in state and not ok(state[key]):
            raise Damaged(f"{path}: {key!r} is {repr(state[key])[:40]}, expected {what}")
    if (named := step_of_dir(directory)) is not None and named != state["step"]:
        raise Damaged(f"{path} says step {state['step']}, its directory says {named}")
    return state


def problems(directory: Path, checksums: bool = True, data_checksums: bool = True) -> list[str]:
    """What is wrong with a checkpoint directory; empty when it is complete and intact.

    Every file it will read is checked: the manifest's shape, each listed file's size and
    checksum, and train_state.json's fields, so that a damaged checkpoint is reported (and
    skipped by --resume auto) instead of failing the run that loads it. data_checksums=False leaves
    the tensor shards' checksums to the loader (verify_share), which hashes them as it reads them.
    """
    if not (directory / MANIFEST).is_file():
        return [f"{directory / MANIFEST} is missing: the save never completed"]
    try:
        manifest = read_manifest(directory)
    except Damaged as e:
        return [str(e)]
    files, algorithm = manifest["files"], manifest["hash"]
    found, to_hash = [], []
    for name, expect in sorted(files.items()):
        path = directory / name
        if "/" in name or "\\" in name or name in ("", ".", "..") or not inside(path, directory):
            found.append(f"{directory}: the manifest names {name!r}, which is outside the checkpoint")
        elif not path.is_file():
            found.append(f"{path} is missing")
        elif path.stat().st_size != expect["bytes"]:
            found.append(f"{path} has {path.stat().st_size} bytes, the manifest says {expect['bytes']} (truncated?)")
        elif checksums and (data_checksums or not name.endswith(DATA_SUFFIX)):
            to_hash.append((path, expect[algorithm]))
    found += _mismatches(to_hash, algorithm)
    for required in (".metadata", TRAIN_STATE):
        if required not in files:
            found.append(f"{directory}: the manifest lists no {required}")
    if TRAIN_STATE in files and not found:
        try:
            read_train_state(directory)
        except Damaged as e:
            found.append(str(e))
    return found


def _mismatches(to_hash: list[tuple[Path, str]], algorithm: str) -> list[str]:
    """The files among (path, expected checksum) whose checksum differs."""
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # the hashes release the GIL: one file per core
        return [f"{path} does not match its {algorithm} checksum in the manifest (corrupted)"
                for (path, expect), actual in zip(to_hash, pool.map(lambda item: _checksum(item[0], algorithm), to_hash))
                if actual != expect]


def data_share(directory: Path, rank: int, world: int) -> tuple[list[str], str]:
    """This rank's share of a checkpoint's tensor shards to verify, and the manifest's hash: every
    world-th in the order of the ranks that wrote them, so a rank resuming in the layout that saved
    gets its own file (the one it reads). The manifest was checked by problems()."""
    manifest = read_manifest(directory)
    names = sorted((n for n in manifest["files"] if n.endswith(DATA_SUFFIX)), key=_numbers_first)
    return names[rank::world], manifest["hash"]


def _numbers_first(name: str) -> list:
    """__10_0.distcp after __9_0.distcp."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def verify_share(directory: Path, rank: int, world: int, hashed: dict[str, str]) -> list[str]:
    """Checksum mismatches among this rank's share of the tensor shards (data_share); `hashed`
    holds the checksums a reader computed as it read (name -> hex), the rest are hashed here."""
    manifest, (names, algorithm) = read_manifest(directory), data_share(directory, rank, world)
    expected = {n: manifest["files"][n][algorithm] for n in names}
    found = [f"{directory / n} does not match its {algorithm} checksum in the manifest (corrupted)"
             for n in names if n in hashed and hashed[n] != expected[n]]
    return found + _mismatches([(directory / n, expected[n]) for n in names if n not in hashed], algorithm)


def _checksum(path: Path, algorithm: str) -> str | None:
    try:
        return digest(path, algorithm)[algorithm]
    except OSError:  # unreadable: reported as a mismatch
        return None


def newest_valid(root: Path, checksums: bool = True, data_checksums: bool = True) -> Path | None:
    """The newest intact checkpoint under root; each damaged newer one is reported with its path."""
    for step, path in reversed(list_checkpoints(root)):
        found = problems(path, checksums, data_checksums)
        if not found:
            return path
        warn(f"checkpoint {path} (step {step}) is damaged or incomplete: {'; '.join(found[:3])}"
             + (f" (and {len(found) - 3} more)" if len(found) > 3 else "") + "; trying the previous one")
    return None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints; returns what was deleted."""
    doomed = [path for _, path in list_checkpoints(root)[:-keep]] if keep > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def remove_partials(root: Path) -> None:
    """Saves a crash interrupted: never committed, never loaded, safe to delete."""
    if root.is_dir():
        for entry in root.iterdir():
            if entry.name.startswith(PARTIAL) and entry.is_dir() and not entry.is_symlink() and inside(entry, root):
                shutil.rmtree(entry, ignore_errors=True)


