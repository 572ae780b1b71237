"""How fast does `shoal data prepare` tokenize, what does a rank's loader hold, and what do document
masks cost? Prints ratios against baselines run side by side; never asserts.

    .venv/bin/python bench/bench_data_prepare.py                # ~100 MB of JSONL, an 8k BPE
    .venv/bin/python bench/bench_data_prepare.py --mb 400 --files 16

1. Tokenizing: the `tokenizers` library's own `encode_batch` on one core (RAYON_NUM_THREADS=1, the
   documents already in memory) is the baseline rate R. `shoal data prepare` with 1 worker and with
   every core (W) on the same JSONL files: goal >= 0.9 x W x R. Then end to end (reading and
   decompressing included) on the same documents as .jsonl.gz and as parquet, in MB of input per s.
2. The loader: peak RSS of a process reading 20 steps of batches from a prepared dataset of 1x and
   of 10x the size (goal: within 5%), and the time from opening a >= 1 GB prepared dataset to its
   first batch (goal: under 10 s). The large datasets are written directly in the prepared format
   (random tokens), since only their size matters here.
3. Packed sequences: training tokens/s of the debug model with document masks vs without, on CPU.

The corpus is this Python's standard library cut into documents of 1-8 KiB, repeated to --mb.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def make_corpus(root: Path, mb: int, files: int) -> list[str]:
    from shoal.data.readers import read_documents
    from shoal.data.sources import list_documents

    text = "".join(t for s in list_documents("stdlib") for _, t in read_documents(s))
    rng = np.random.default_rng(0)
    docs, size, pos = [], 0, 0
    while size < mb * 1e6:
        n = int(rng.integers(1024, 8192))
        doc = text[pos:pos + n] or text[:n]
        pos = (pos + n) % len(text)
        docs.append(doc)
        size += len(doc.encode())
    paths = []
    for f in range(files):
        path = root / f"part{f:03d}.jsonl"
        with open(path, "w") as out:
            for d in docs[f::files]:
                out.write(json.dumps({"text": d}) + "\n")
        paths.append(str(path))
    return paths


def make_tokenizer(path: Path, files: list[str]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(files[:1], trainer)
    tok.save(str(path))
    return str(path)


ONE_CORE = """
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(l)["text"] for f in sys.argv[2:] for l in open(f)]
t = time.perf_counter()
n = 0
for i in range(0, len(docs), 1024):
    n += sum(len(e.ids) for e in tok.encode_batch(docs[i:i + 1024], add_special_tokens=False))
print(json.dumps({"tokens": n, "seconds": time.perf_counter() - t}))
"""


def one_core_rate(tokenizer: str, files: list[str], processes: int = 1) -> float:
    """Tokens/s of `processes` baseline processes at once, each on its share of the files: with more
    than one, what the machine itself gives several single-threaded tokenizers (the ceiling for
    prepare's workers, below processes x one core where cores share caches or a host)."""
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    runs = [subprocess.Popen([sys.executable, "-c", ONE_CORE, tokenizer, *files[i::processes]], env=env,
                             stdout=subprocess.PIPE, text=True) for i in range(processes)]
    results = [json.loads(r.communicate()[0]) for r in runs]
    return sum(r["tokens"] for r in results) / max(r["seconds"] for r in results)


def timed_prepare(files: list[str], tokenizer: str, out: Path, workers: int) -> tuple[float, int]:
    from shoal.data.dataset import open_dataset
    from shoal.data.prepare import prepare

    t = time.perf_counter()
    prepare(files, tokenizer, str(out), workers=workers, show=False)
    seconds = time.perf_counter() - t
    return seconds, sum(r.tokens for r in open_dataset(str(out)).shards)


def write_random_dataset(root: Path, tokens: int, shards: int) -> str:
    """A valid prepared dataset of `tokens` random byte-tokenizer ids (documents of ~4k tokens)."""
    from dataclasses import asdict

    from shoal.data import dataset as ds
    from shoal.files import write_json

    settings = ds.Settings(tokenizer="byte-utf8", vocab_size=256, eos_id=0, dtype="<u2", text_field="text",
                           val_fraction=0.01)
    os.makedirs(root / ds.SHARDS, exist_ok=True)
    rng, records = np.random.default_rng(1), []
    per = tokens // shards
    for i in range(shards):
        key = f"random-{i:04d}"
        tok, docs, rec = ds.shard_paths(str(root), key)
        ids = rng.integers(1, 256, per, dtype=np.uint16)
        ends = np.arange(4096, per + 1, 4096, dtype=np.uint64)
        if ends[-1] != per:
            ends = np.append(ends, np.uint64(per))
        ids[ends.astype(np.int64) - 1] = 0
        ids.tofile(tok)
        ends.tofile(docs)
        val_docs = max(1, len(ends) // 100)
        val_tokens = per - int(ends[-val_docs - 1])
        record = ds.ShardRecord(key=key, source=key, source_size=0, source_mtime_ns=0, train_tokens=per - val_tokens,
                                val_tokens=val_tokens, train_docs=len(ends) - val_docs, val_docs=val_docs,
                                checksum=ds.file_checksum(tok, docs), tokens_mtime_ns=os.stat(tok).st_mtime_ns)
        write_json(rec, asdict(record))
        records.append(record)
    ds.write_manifest(str(root), settings, records, None)
    return str(root)


LOADER = """
import json, resource, sys, time
t = time.perf_counter()
from shoal.data.corpus import open_corpus
from shoal.data.loader import Part, TokenLoader
from shoal.data.tokenizer import ByteTokenizer
from shoal.config import DataConfig
c = open_corpus(sys.argv[1], 1.0, ByteTokenizer(), DataConfig(path=sys.argv[1]))
loader = TokenLoader([Part(c.name, c.train)], 2048, 64, 8, seed=0)
loader.next_step()
first = time.perf_counter() - t
for _ in range(19):
    loader.next_step()
print(json.dumps({"first_s": first, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def loader_probe(path: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    out = subprocess.run([sys.executable, "-c", LOADER, path], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def masked_speed(steps: int = 6) -> tuple[float, float]:
    from shoal.data.loader import TokenLoader
    from shoal.model.config import get_preset
    from shoal.model.transformer import build_model, cross_entropy

    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 256, 400_000).astype(np.uint16)
    tokens[rng.choice(len(tokens), len(tokens) // 800, replace=False)] = 0  # documents of ~800 tokens
    model = build_model(get_preset("debug").replace(max_seq_len=1024))
    rates = []
    for documents in (None, 0):
        loader = TokenLoader(tokens, 1024, 8, 8, documents=documents)
        t, n = 0.0, 0
        for s in range(steps):
            (x, y, *d), = loader.next_step()
            start = time.perf_counter()
            cross_entropy(model(x, *d), y).backward()
            if s:  # the first step warms up
                t += time.perf_counter() - start
                n += x.numel()
        rates.append(n / t)
    return rates[0], rates[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100, help="corpus size in MB of text")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--big-gb", type=float, default=1.0, help="size of the large prepared dataset (loader timing)")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="shoal-bench-data-") as tmp:
        root = Path(tmp)
        (root / "jsonl").mkdir()
        files = make_corpus(root / "jsonl", args.mb, args.files)
        mb = sum(os.path.getsize(f) for f in files) / 1e6
        tokenizer = make_tokenizer(root / "tokenizer.json", files)
        rate = one_core_rate(tokenizer, files)
        print(f"corpus: {len(files)} JSONL files, {mb:.0f} MB; 8k BPE; {cores} cores")
        print(f"tokenizers encode_batch, one core, in memory: {rate / 1e6:.2f} M tokens/s")
        if cores > 1:
            together = one_core_rate(tokenizer, files, cores)
            print(f"the same in {cores} processes at once: {together / 1e6:.2f} M tokens/s = "
                  f"{together / (cores * rate):.2f} x ({cores} x one-core rate): the machine's own ceiling")
        for workers in sorted({1, cores}):
            seconds, tokens = timed_prepare(files, tokenizer, root / f"w{workers}", workers)
            r = tokens / seconds
            print(f"shoal data prepare --workers {workers}: {r / 1e6:.2f} M tokens/s, {mb / seconds:.1f} MB/s = "
                  f"{r / (workers * rate):.2f} x ({workers} x one-core rate)")
        (root / "gz").mkdir()
        for f in files:
            with open(f, "rb") as src, gzip.open(root / "gz" / (Path(f).name + ".gz"), "wb", compresslevel=6) as dst:
                dst.write(src.read())
        import pyarrow as pa
        import pyarrow.parquet as pq

        (root / "parquet").mkdir()
        for f in files:
            texts = [json.loads(line)["text"] for line in open(f)]
            pq.write_table(pa.table({"text": texts}), root / "parquet" / (Path(f).stem + ".parquet"))
        for kind in ("gz", "parquet"):
            inputs = sorted(str(p) for p in (root / kind).iterdir())
            on_disk = sum(os.path.getsize(p) for p in inputs) / 1e6
            seconds, _ = timed_prepare(inputs, tokenizer, root / f"ds-{kind}", cores)
            print(f"end to end, {kind}: {on_disk:.0f} MB on disk ({mb:.0f} MB of JSONL) in {seconds:.1f} s = "
                  f"{mb / seconds:.1f} MB/s of JSONL-equivalent text ({cores} workers)")

        small_tokens = int(args.big_gb * 1e9 / 2 / 10)
        small = write_random_dataset(root / "small", small_tokens, 8)
        big = write_random_dataset(root / "big", small_tokens * 10, 80)
        a, b = loader_probe(small), loader_probe(big)
        print(f"loader peak RSS: {a['rss_mb']:.0f} MB on {small_tokens * 2 / 1e9:.2f} GB, {b['rss_mb']:.0f} MB on "
              f"{small_tokens * 20 / 1e9:.2f} GB = {b['rss_mb'] / a['rss_mb']:.3f} x")
        print(f"first batch of a {small_tokens * 20 / 1e9:.2f} GB prepared dataset: {b['first_s']:.2f} s after "
              "the process started (imports included)")
    plain, masked = masked_speed()
    print(f"debug model, seq 1024, CPU: {plain:,.0f} tokens/s unmasked, {masked:,.0f} masked = {masked / plain:.2f} x")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    main()
