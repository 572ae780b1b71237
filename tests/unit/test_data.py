"""shoal.data: tokenizers, corpus sources and formats, prepared datasets, and the deterministic DP-sharded loader."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import torch

from shoal.config import DataConfig
from shoal.data.corpus import load_data
from shoal.data.dataset import MANIFEST, in_val, open_dataset, token_dtype
from shoal.data.loader import Part, TokenLoader, eval_batches
from shoal.data.prepare import prepare
from shoal.data.readers import read_documents
from shoal.data.sources import list_documents
from shoal.data.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from shoal.errors import UserError

BYTE = ByteTokenizer()


def write(path, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def corpus_dir(tmp_path, n: int = 40) -> str:
    """n small documents with distinct, recognisable text."""
    for i in range(n):
        write(tmp_path / "corpus" / f"doc{i:03d}.txt", f"document {i} " + "lorem ipsum " * (5 + i % 7))
    return str(tmp_path / "corpus")


def documents_of(stream: np.ndarray, eos: int = 0) -> list[str]:
    """Split a cached token stream back into document texts."""
    text = BYTE.decode(np.where(stream == eos, ord("\x1e"), stream))  # keep boundaries visible
    return [d for d in text.split("\x1e") if d]


# ---------------------------------------------------------------- tokenizers


def test_byte_tokenizer_roundtrip():
    text = "héllo, wörld — ∑ 🐟\n\tdef f(): pass"
    ids = BYTE.encode(text)
    assert ids == list(text.encode("utf-8")) and min(ids) > 0 and max(ids) < 256
    assert BYTE.decode(ids) == text
    assert BYTE.decode([0] + ids[:5] + [0] + ids[5:] + [0]) == text  # eos is skipped
    assert BYTE.decode(torch.tensor(ids)) == text  # tensors and arrays decode too
    assert BYTE.decode([0xFF, ord("a")]) == "\ufffda"  # invalid UTF-8 is replaced, not an error
    assert [a.tolist() for a in BYTE.encode_many([text, "x"])] == [ids, [ord("x")]]
    assert load_tokenizer("byte").identity == BYTE.identity


@pytest.fixture(scope="module")
def hf_tokenizer_path(tmp_path_factory) -> str:
    """A tiny byte-level BPE trained on the fly: no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 50, trainer=trainer)
    path = str(tmp_path_factory.mktemp("hf") / "tokenizer.json")
    tok.save(path)
    return path


def test_hf_tokenizer_roundtrip(hf_tokenizer_path):
    tok = load_tokenizer(hf_tokenizer_path)
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_id == 1 and tok.vocab_size <= 300
    text = "the lazy fox, über alles"
    ids = tok.encode(text)
    assert tok.eos_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_id]) == text
    assert [a.tolist() for a in tok.encode_many([text])] == [ids]
    assert tok.identity.startswith("hf-") and tok.identity != BYTE.identity


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(UserError) as e:
        load_tokenizer(str(tmp_path / "nope.json"))
    assert e.value.field == "data.tokenizer"
    with pytest.raises(UserError, match="not a readable tokenizers JSON") as e:
        load_tokenizer(write(tmp_path / "bad.json", "{not json"))
    assert e.value.field == "data.tokenizer"


# ---------------------------------------------------------------- sources


def test_sources_file_glob_dir(tmp_path):
    d = corpus_dir(tmp_path, n=3)
    write(tmp_path / "corpus" / "sub" / "notes.md", "# notes")
    write(tmp_path / "corpus" / "image.png", "not text")  # skipped by extension in a directory walk
    write(tmp_path / "corpus" / ".git" / "HEAD.txt", "hidden")  # hidden folders are skipped

    one = list_documents(os.path.join(d, "doc001.txt"))
    assert [s.name for s in one] == ["doc001.txt"]
    assert list(read_documents(one[0]))[0][1].startswith("document 1 ")

    globbed = list_documents(os.path.join(d, "doc00[02].txt"))
    assert [s.name for s in globbed] == ["doc000.txt", "doc002.txt"]

    walked = list_documents(d)
    assert [s.name for s in walked] == ["doc000.txt", "doc001.txt", "doc002.txt", os.path.join("sub", "notes.md")]


def test_sources_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    lines = [{"text": "first doc"}, {"text": "second", "id": 2}, {"content": "third"}]
    write(path, "\n".join(json.dumps(x) for x in lines[:2]) + "\n\n")
    (src,) = list_documents(str(path))
    assert list(read_documents(src)) == [("data.jsonl:1", "first doc"), ("data.jsonl:2", "second")]

    (src,) = list_documents(str(path), text_field="body")
    with pytest.raises(UserError, match=r"data\.jsonl:1 has no such field") as e:
        list(read_documents(src))
    assert e.value.field == "data.text_field"

    write(path, "\n".join(json.dumps(x) for x in lines) + "\n")
    with pytest.raises(UserError, match=r"data\.jsonl:3 has no such field"):
        build(path, cache=tmp_path / "cache")


@pytest.mark.parametrize("record", [{"prompt": "Q", "completion": None}, {"prompt": ["Q"], "completion": "A"}])
def test_prompt_and_completion_that_are_not_strings_are_named(record, tmp_path):
    # the record has both: "has no such field ... give fine-tuning records as prompt and completion" misled
    write(tmp_path / "sft.jsonl", json.dumps({"text": "plain"}) + "\n" + json.dumps(record) + "\n")
    (src,) = list_documents(str(tmp_path / "sft.jsonl"))
    with pytest.raises(UserError, match="prompt and completion must both be strings") as e:
        list(read_documents(src))
    assert (e.value.field, e.value.value) == ("data.path", f"{tmp_path / 'sft.jsonl'}:2")


def test_sources_errors(tmp_path):
    with pytest.raises(UserError, match="no such file") as e:
        list_documents(str(tmp_path / "missing.txt"))
    assert (e.value.field, e.value.value) == ("data.path", str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match="no such file"):
        list_documents(str(tmp_path / "*.nothing"))
    write(tmp_path / "empty" / "a.txt", "")
    write(tmp_path / "empty" / "b.txt", "")
    with pytest.raises(UserError, match="corpus is empty"):
        list_documents(str(tmp_path / "empty"))
    (tmp_path / "latin").mkdir()
    with open(os.path.join(os.fsencode(tmp_path / "latin"), b"caf\xe9.txt"), "w") as f:  # a latin-1 name
        f.write("text")
    with pytest.raises(UserError, match="has a name that is not UTF-8 text"):  # was a UnicodeEncodeError
        list_documents(str(tmp_path / "latin"))
    write(tmp_path / "blank.jsonl", '{"text": ""}\n{"text": null}\n')  # non-empty files, no text
    with pytest.raises(UserError, match="corpus is empty") as e:  # of the corpus, not of the token cache
        build(tmp_path / "blank.jsonl", cache=tmp_path / "cache")
    assert e.value.field == "data.path"


# ---------------------------------------------------------------- prepared datasets


def build(path, tokenizer="byte", cache=None, val_fraction=0.01, text_field="text"):
    """What a run trains on for `data.path = path` (prepared into the cache on first use)."""
    data = DataConfig(path=str(path), tokenizer=tokenizer, cache_dir=str(cache or ""), val_fraction=val_fraction,
                      text_field=text_field)
    return load_data(data, 1 << 20)[1][0]


def everything(stream) -> np.ndarray:
    return stream.read(0, len(stream))


def test_prepared_once_then_reused_and_edits_redo_one_file(tmp_path, hf_tokenizer_path):
    d = corpus_dir(tmp_path)
    first = prepare([d], "byte", str(tmp_path / "ds"))
    assert (first.shards_done, first.shards_kept, first.complete) == (40, 0, True)
    dataset = open_dataset(str(tmp_path / "ds"))
    assert dataset.dtype == np.uint16 and len(dataset.shards) == 40
    manifest = tmp_path / "ds" / MANIFEST  # every start on the corpus passes here: no rewrite when nothing moved
    mtimes = {f: os.stat(f).st_mtime_ns for f in [*dataset.files(), manifest]}
    again = prepare([d], "byte", str(tmp_path / "ds"))
    assert (again.shards_done, again.shards_kept) == (0, 40)
    assert all(os.stat(f).st_mtime_ns == m for f, m in mtimes.items())

    write(os.path.join(d, "doc000.txt"), "edited")
    os.remove(os.path.join(d, "doc001.txt"))
    edited = prepare([d], "byte", str(tmp_path / "ds"))
    assert (edited.shards_done, edited.shards_kept) == (1, 38)
    assert len(os.listdir(tmp_path / "ds" / "shards")) == 39 * 3  # the removed file's shard went too
    assert os.stat(manifest).st_mtime_ns != mtimes[manifest] and len(open_dataset(str(tmp_path / "ds")).shards) == 39
    # Another tokenizer is another dataset: refused in place, its own folder in the cache.
    with pytest.raises(UserError, match="prepared with other settings") as e:
        prepare([d], hf_tokenizer_path, str(tmp_path / "ds"))
    assert e.value.field == "--out"
    byte, hf = build(d, cache=tmp_path / "cache"), build(d, hf_tokenizer_path, cache=tmp_path / "cache")
    assert byte.dataset.path != hf.dataset.path and len(hf.train) < len(byte.train)


def test_workers_and_parts_write_the_same_shards(tmp_path):
    d = corpus_dir(tmp_path, n=6)
    prepare([d], "byte", str(tmp_path / "one"), workers=1)
    prepare([d], "byte", str(tmp_path / "pool"), workers=2)  # spawned processes
    first = prepare([d], "byte", str(tmp_path / "parts"), part=(1, 2))
    assert not first.complete and first.shards_done == 3
    with pytest.raises(UserError, match=r"parts are not all done \(1-of-2.json written\)"):
        open_dataset(str(tmp_path / "parts"))
    assert prepare([d], "byte", str(tmp_path / "parts"), part=(0, 2)).complete
    shards = [open_dataset(str(tmp_path / x)).shards for x in ("one", "pool", "parts")]
    assert [[r.checksum for r in s] for s in shards[1:]] == [[r.checksum for r in shards[0]]] * 2


def test_a_failed_cache_write_names_the_cause(tmp_path, monkeypatch):
    """A full disk while the cache is written."""
    import shoal.data.prepare as prepare_module

    def fail(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prepare_module, "tokenize_file", fail)
    with pytest.raises(UserError, match="writing the token cache failed .No space left on device.; free space") as e:
        build(corpus_dir(tmp_path), cache=tmp_path / "cache")
    assert e.value.field == "data.cache_dir"


def test_damaged_or_foreign_datasets_are_refused(tmp_path, hf_tokenizer_path):
    d = corpus_dir(tmp_path, n=4)
    out = str(tmp_path / "ds")
    prepare([d], "byte", out)
    tokens = open_dataset(out).files()[1]
    with open(tokens, "r+b") as f:  # one byte changed, size kept
        f.seek(3)
        f.write(b"\x07")
    with pytest.raises(UserError, match="changed after preparation") as e:
        open_dataset(out)
    assert e.value.field == "data.path" and tokens in str(e.value)
    os.truncate(tokens, 10)
    with pytest.raises(UserError, match="cut or overwritten"):
        build(out)
    assert prepare([d], "byte", out).shards_done == 1  # preparing again redoes only that shard
    with pytest.raises(UserError, match=r"is not the tokenizer .* was prepared with \(byte\)") as e:
        build(out, hf_tokenizer_path)
    assert e.value.field == "data.tokenizer"
    with pytest.raises(UserError, match="prepared holding out 0.01") as e:
        build(out, val_fraction=0.05)
    with pytest.raises(UserError, match="holds something other than a prepared dataset"):
        prepare([d], "byte", d)
    with pytest.raises(UserError, match="not a prepared dataset"):
        open_dataset(d)


MANIFEST_DAMAGE = {  # a hand edit or another tool's: a field of another type than shoal writes
    "count_string": lambda m: m["shards"][0].update(train_tokens="15"),
    "vocab_bool": lambda m: m.update(vocab_size=True),
    "dtype_unknown": lambda m: m.update(dtype="bogus"),
}


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE)
def test_a_manifest_field_of_another_type_is_refused_and_mended(damage, tmp_path):
    d, out = corpus_dir(tmp_path, n=2), str(tmp_path / "ds")
    prepare([d], "byte", out)
    path = tmp_path / "ds" / "shoal_dataset.json"
    manifest = json.loads(path.read_text())
    MANIFEST_DAMAGE[damage](manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="shoal_dataset.json") as e:  # was a TypeError, or took True for 1 token
        open_dataset(out)
    assert e.value.field == "data.path"
    assert prepare([d], "byte", out).shards_done == 0  # preparing again, as the line says, mends it
    assert open_dataset(out).settings.vocab_size == 256


@pytest.mark.parametrize("damage", ["{", "[]", "folder"])
def test_a_damaged_prepare_state_is_refused(damage, tmp_path):
    d, out = corpus_dir(tmp_path, n=2), tmp_path / "ds"
    prepare([d], "byte", str(out))
    state = out / "prepare.json"
    state.unlink()
    state.mkdir() if damage == "folder" else state.write_text(damage)
    with pytest.raises(UserError, match="damaged prepare.json") as e:  # was a traceback
        prepare([d], "byte", str(out))
    assert e.value.field == "--out"


def test_a_damaged_part_is_named_and_mended_by_running_it_again(tmp_path):
    d, out = corpus_dir(tmp_path, n=4), str(tmp_path / "ds")
    prepare([d], "byte", out, part=(0, 2))
    (tmp_path / "ds" / "parts" / "0-of-2.json").write_text("[]")
    with pytest.raises(UserError, match=r"parts/0-of-2.json is damaged .*run part 0/2 again") as e:
        prepare([d], "byte", out, part=(1, 2))
    assert e.value.field == "--shard"
    assert prepare([d], "byte", out, part=(0, 2)).complete


def test_a_refused_first_prepare_leaves_no_folder(tmp_path):
    """Refused for its text field, the folders it made go again: the fix the line names is then not
    refused as a "dataset prepared with other settings" (text_field 'text' -> 'body')."""
    src, out = write(tmp_path / "a.jsonl", '{"body": "hello world"}\n'), tmp_path / "new" / "ds"
    with pytest.raises(UserError, match="no such field"):
        prepare([src], "byte", str(out))
    assert not (tmp_path / "new").exists()
    assert prepare([src], "byte", str(out), text_field="body").complete
    blank = write(tmp_path / "blank.jsonl", '{"text": ""}\n{"text": null}\n')  # read to the end: its shard was written
    with pytest.raises(UserError, match="corpus is empty"):
        prepare([blank], "byte", str(tmp_path / "empty"))
    assert not (tmp_path / "empty").exists()


def test_val_split_is_by_document(tmp_path):
    d = corpus_dir(tmp_path, n=200)
    corpus = build(d, cache=tmp_path / "cache", val_fraction=0.1)
    train, val = documents_of(everything(corpus.train)), documents_of(everything(corpus.val))
    texts = sorted(open(os.path.join(d, f)).read() for f in os.listdir(d))
    assert sorted(train + val) == texts  # every document exactly once
    assert not set(train) & set(val)
    assert 0 < len(val) < len(train) and (corpus.train_docs, corpus.val_docs) == (len(train), len(val))
    # held-out documents are the ones whose name hashes into the val bucket
    held = {f"document {int(f[3:6])} " for f in os.listdir(d) if in_val(f, 0.1)}
    assert {v.split("lorem")[0] for v in val} == held


def test_val_split_never_empty(tmp_path):
    # Two documents, neither of which hashes into a 1% bucket: the tail document is held out.
    write(tmp_path / "two" / "a.txt", "alpha " * 50)
    write(tmp_path / "two" / "b.txt", "beta " * 50)
    corpus = build(tmp_path / "two", cache=tmp_path / "cache")
    assert documents_of(everything(corpus.val)) == ["beta " * 50]
    assert documents_of(everything(corpus.train)) == ["alpha " * 50]
    # One document: the split falls inside it, still with no token on both sides.
    single = write(tmp_path / "one.txt", "".join(f"line {i}\n" for i in range(1000)))
    corpus = build(single, cache=tmp_path / "cache")
    assert 0 < len(corpus.val) < len(corpus.train)
    stream = np.concatenate([everything(corpus.train), everything(corpus.val)])
    assert BYTE.decode(stream) == open(single).read() and stream[-1] == 0


def test_concurrent_runs_prepare_once(tmp_path):
    d = corpus_dir(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(build(d, cache=tmp_path / "cache")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len({r.dataset.path for r in results}) == 1
    assert not [f for _, _, fs in os.walk(tmp_path / "cache") for f in fs if f.endswith(".tmp")]


def test_token_dtype():
    assert token_dtype(256) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(128256) == np.uint32


def test_stdlib_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    corpus = build("stdlib")
    assert corpus.dataset.path.startswith(str(tmp_path / "tokens"))
    assert len(corpus.train) > 1_000_000 and len(corpus.val) > 1000
    assert "import" in BYTE.decode(everything(corpus.val))
    names = [s.name for s in list_documents("stdlib")]
    assert names == sorted(names) and "os.py" in names
    assert not any(part in ("test", "tests", "site-packages") for n in names for part in n.split(os.sep))


# ---------------------------------------------------------------- formats


def test_compressed_and_columnar_inputs_read_alike(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    rows = [{"text": f"row {i} " + "words " * i, "id": i} for i in range(1, 30)]
    lines = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    half = len(lines) // 2  # two frames, as pzstd and appending writers leave them
    (tmp_path / "b.jsonl.zst").write_bytes(b"".join(zstandard.ZstdCompressor().compress(part)
                                                    for part in (lines[:half], lines[half:])))
    (tmp_path / "c.json").write_text(json.dumps(rows))
    # a byte order mark and a pretty-printer's newline before the array, a null text (an empty document)
    (tmp_path / "n.json").write_bytes(b"\xef\xbb\xbf\n" + json.dumps(rows + [{"text": None}], indent=1).encode())
    table = pa.table({"text": [r["text"] for r in rows], "id": [r["id"] for r in rows]})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=7)
    # pandas writes a categorical column as a dictionary of strings
    pq.write_table(pa.table({"text": table["text"].dictionary_encode()}), tmp_path / "g.parquet")
    with pa.ipc.new_stream(str(tmp_path / "e.arrow"), table.schema) as w:  # as datasets.save_to_disk writes
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    (tmp_path / "f.txt.gz").write_bytes(gzip.compress(b"one plain document"))
    (tmp_path / "dict" / "train").mkdir(parents=True)  # a DatasetDict: one split at a time, never all
    (tmp_path / "dict" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(UserError, match="is a Hugging Face DatasetDict with the splits train"):
        list_documents(str(tmp_path / "dict"))
    os.remove(tmp_path / "dict" / "dataset_dict.json")
    sources = list_documents(str(tmp_path))
    assert [(s.name, s.kind, s.compression) for s in sources] == [
        ("a.jsonl.gz", "jsonl", "gzip"), ("b.jsonl.zst", "jsonl", "zstd"), ("d.parquet", "parquet", ""),
        ("e.arrow", "arrow", ""), ("f.txt.gz", "text", "gzip"), ("g.parquet", "parquet", "")]  # not .json
    texts = [r["text"] for r in rows]
    for s in sources[:4] + sources[5:] + list_documents(str(tmp_path / "c.json")):
        docs = list(read_documents(s))
        assert [t for _, t in docs] == texts, s.name
        assert docs[0][0] == f"{s.name}:{0 if s.name == 'c.json' else 1}"
    assert list(read_documents(sources[4])) == [("f.txt.gz", "one plain document")]
    assert [t for _, t in read_documents(*list_documents(str(tmp_path / "n.json")))] == texts + [""]


def test_damaged_inputs_are_named(tmp_path):
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    whole = gzip.compress(b'{"text": "x"}\n' * 5000)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "fake.jsonl.gz").write_bytes(b"not gzip at all")
    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "other.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 garbage")
    for name, match in [("fake.jsonl.gz", "is not a readable gzip jsonl file"),
                        ("bad.parquet", "is not a readable parquet file")]:
        with pytest.raises(UserError, match=match) as e:
            list_documents(str(tmp_path / name))
        assert e.value.value == str(tmp_path / name)
    with pytest.raises(UserError, match=r"has no such column \(it has \['body'\]\)") as e:
        list_documents(str(tmp_path / "other.parquet"))
    assert e.value.field == "data.text_field"
    (cut,) = list_documents(str(tmp_path / "cut.jsonl.gz"))  # the start reads; the damage is further in
    with pytest.raises(UserError, match="is not a readable gzip jsonl file"):
        prepare([cut.path], "byte", str(tmp_path / "ds"))
    import zstandard

    whole = zstandard.ZstdCompressor().compress(b'{"text": "x"}\n' * 5000)
    (tmp_path / "cut.jsonl.zst").write_bytes(whole[: len(whole) // 2])  # zstandard's reader ended here quietly
    (tmp_path / "fake.jsonl.zst").write_bytes(b"not zstd at all")  # a ZstdError traceback
    (tmp_path / "deep.jsonl").write_text('{"text": "x"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")  # RecursionError
    for name, match in [("cut.jsonl.zst", "is not a readable zstd jsonl file .the zstd stream ends inside a frame"),
                        ("fake.jsonl.zst", "is not a readable zstd jsonl file"),
                        ("deep.jsonl", "deep.jsonl:2.: not a JSON object")]:
        with pytest.raises(UserError, match=match):
            prepare([str(tmp_path / name)], "byte", str(tmp_path / f"ds-{name}"))


def test_stray_bytes_and_lone_surrogates_in_json_read_as_replacement_characters(tmp_path, hf_tokenizer_path):
    """Past the sniffed start a JSON record reads as a text file does: an invalid byte is U+FFFD (it refused
    the corpus as 'not a JSON object'), and so is an unpaired surrogate escape, which no tokenizer encodes
    (the tokenizers library raised a TypeError out of prepare)."""
    start = "".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(100)).encode()  # past SNIFF_BYTES
    (tmp_path / "bytes.jsonl").write_bytes(start + b'{"text": "caf\xe9"}\n')
    (tmp_path / "escape.jsonl").write_bytes(start + b'{"text": "fish \\ud83d!"}\n{"text": "\\ud83d\\udc1f"}\n')
    (tmp_path / "bytes.json").write_bytes(b'[{"text": "x"}, ' + b" " * 2000 + b'{"text": "caf\xe9"}]')
    for name, last in [("bytes.jsonl", ["caf\ufffd"]), ("escape.jsonl", ["fish \ufffd!", "\U0001f41f"]),
                       ("bytes.json", ["caf\ufffd"])]:
        (src,) = list_documents(str(tmp_path / name))
        assert [t for _, t in read_documents(src)][-len(last):] == last, name
    prepare([str(tmp_path / "escape.jsonl")], hf_tokenizer_path, str(tmp_path / "ds"))


# ---------------------------------------------------------------- loader


def stream(n: int = 10_000) -> np.ndarray:
    return (np.arange(n) % 251 + 1).astype(np.uint16)  # any window identifies its offset


def global_inputs(loader: TokenLoader) -> torch.Tensor:
    return torch.cat([x for x, _ in loader.next_step()])


def test_loader_shapes_and_targets():
    tokens = stream()
    loader = TokenLoader(tokens, seq_len=16, global_batch=8, micro_batch=2)
    batches = loader.next_step()
    assert len(batches) == 4
    for x, y in batches:
        assert x.shape == y.shape == (2, 16) and x.dtype == torch.long
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
        for row in x:  # every row is the window at some chunk start
            assert any(np.array_equal(tokens[o:o + 16], row.numpy()) for o in range(0, len(tokens) - 16, 16))
    assert loader.state_dict()["step"] == 1


def test_loader_deterministic_and_seeded():
    tokens = stream()
    a, b = (TokenLoader(tokens, 16, 8, 4, seed=3) for _ in range(2))
    for _ in range(3):
        assert torch.equal(global_inputs(a), global_inputs(b))
    assert not torch.equal(global_inputs(TokenLoader(tokens, 16, 8, 4, seed=3)),
                           global_inputs(TokenLoader(tokens, 16, 8, 4, seed=4)))


def test_dp_ranks_partition_the_global_batch():
    tokens = stream()
    single = TokenLoader(tokens, 16, global_batch=8, micro_batch=8)
    other_micro = TokenLoader(tokens, 16, global_batch=8, micro_batch=1)
    ranks = [TokenLoader(tokens, 16, global_batch=8, micro_batch=2, dp_rank=r, dp_size=2) for r in range(2)]
    for _ in range(3):
        whole = global_inputs(single)
        assert torch.equal(global_inputs(other_micro), whole)  # micro_batch does not change the set
        per_rank = [loader.next_step() for loader in ranks]
        assert all(len(b) == 2 for b in per_rank)
        assert torch.equal(torch.cat([x for b in per_rank for x, _ in b]), whole)


def test_epochs_cover_every_chunk_then_reshuffle():
    tokens = stream(16 * 10 + 1)  # exactly 10 chunks
    loader = TokenLoader(tokens, 16, global_batch=5, micro_batch=5)
    first = torch.cat([global_inputs(loader), global_inputs(loader)])[:, 0]
    second = torch.cat([global_inputs(loader), global_inputs(loader)])[:, 0]
    starts = sorted(int(tokens[i * 16]) for i in range(10))
    assert sorted(first.tolist()) == starts and sorted(second.tolist()) == starts
    assert not torch.equal(first, second)
    assert loader.epoch == 2.0


def test_resume_continues_with_the_next_batch():
    tokens = stream()
    run = TokenLoader(tokens, 16, 8, 2, seed=7)
    seen = [global_inputs(run) for _ in range(3)]
    resumed = TokenLoader(tokens, 16, 8, 2, seed=7)
    state = TokenLoader(tokens, 16, 8, 2, seed=7)
    for _ in range(2):
        state.next_step()
    resumed.load_state_dict(state.state_dict())
    assert json.loads(json.dumps(state.state_dict())) == state.state_dict()  # plain values, for train_state.json
    nxt = global_inputs(resumed)
    assert torch.equal(nxt, seen[2]) and not torch.equal(nxt, seen[1])
    # Resuming on a different number of ranks continues with the same global batch.
    rank1 = TokenLoader(tokens, 16, 8, 2, dp_rank=1, dp_size=2, seed=7)
    rank1.load_state_dict(state.state_dict())
    assert torch.equal(global_inputs(rank1), seen[2][4:])


def test_loader_errors():
    with pytest.raises(UserError, match=r"multiple of micro_batch\*dp_size = 2\*2 = 4; try 8 or 12") as e:
        TokenLoader(stream(), 16, global_batch=10, micro_batch=2, dp_size=2)
    assert e.value.field == "train.global_batch"
    with pytest.raises(UserError, match=r"corpus has 10 tokens, fewer than seq_len\+1 = 17") as e:
        TokenLoader(stream(10), 16, 4, 4, source="tiny.txt")
    assert (e.value.field, e.value.value) == ("data.path", "tiny.txt")


def test_eval_batches_fixed_and_sharded():
    val = stream(2000)
    a = eval_batches(val, 16, batch=4, n_batches=3)
    b = eval_batches(val, 16, batch=4, n_batches=3)
    assert len(a) == 3 and all(x.shape == (4, 16) for x, _ in a)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    ranks = [eval_batches(val, 16, 4, 3, dp_rank=r, dp_size=2) for r in range(2)]
    for i in range(3):
        assert torch.equal(torch.cat([ranks[0][i][0], ranks[1][i][0]]), a[i][0])
    with pytest.raises(UserError, match="held-out split has"):
        eval_batches(stream(10), 16, 4, 1)
    with pytest.raises(UserError) as e:
        eval_batches(val, 16, batch=3, n_batches=1, dp_size=2)
    assert e.value.field == "eval.batch"


def test_streams_read_across_shards_as_one_array():
    from shoal.data.stream import Region, TokenStream

    tokens = stream(5000)
    files = []
    for i, (a, b) in enumerate([(0, 1000), (1000, 1001), (1001, 5000)]):
        path = f"{os.environ.get('TMPDIR', '/tmp')}/shoal-stream-{os.getpid()}-{i}"
        np.concatenate([np.full(7, 9, np.uint16), tokens[a:b]]).tofile(path)  # 7 tokens before the region
        files.append((path, b - a))
    joined = TokenStream([Region(f, 7, n) for f, n in files], np.uint16)
    try:
        starts = np.array([0, 990, 995, 1000, 4983])
        assert np.array_equal(joined.windows(starts, 17), tokens[starts[:, None] + np.arange(17)])
        assert np.array_equal(joined.slice(998, 1003).read(0, 5), tokens[998:1003])
        a, b = (TokenLoader(t, 16, 8, 4, seed=1) for t in (joined, tokens))
        assert torch.equal(global_inputs(a), global_inputs(b))
    finally:
        for f, _ in files:
            os.remove(f)


def test_shuffled_order_is_a_permutation_in_constant_memory():
    from shoal.data.permutation import permute, round_keys

    for n in (1, 2, 3, 7, 1000, 4097):
        assert sorted(permute(np.arange(n), n, round_keys(0, 0)).tolist()) == list(range(n))
    assert not np.array_equal(permute(np.arange(50), 50, round_keys(0, 0)), permute(np.arange(50), 50, round_keys(0, 1)))
    big = permute(np.arange(1000), 10**12, round_keys(5, 0))  # no array of 10**12 entries is made
    assert len(set(big.tolist())) == 1000 and big.max() < 10**12


def test_mixture_shares_follow_the_weights_and_resume():
    a, b = stream(20_000), (stream(20_000) + 300).astype(np.uint16)  # b's tokens are all > 251
    parts = [Part("a", a, 0.7), Part("b", b, 0.3)]
    loader = TokenLoader(parts, 16, global_batch=10, micro_batch=5, seed=2)
    for steps in (1, 3, 20):
        while loader.step < steps:
            x = global_inputs(loader)
        share = loader.drawn[0] / sum(loader.drawn)
        assert abs(share - 0.7) <= 1 / sum(loader.drawn)  # within one sequence at every step
    assert loader.tokens_drawn() == {"a": loader.drawn[0] * 16, "b": loader.drawn[1] * 16}
    from_b = (x[:, 0] > 251).sum().item()
    assert from_b == 3  # this step's rows come from their corpus
    resumed = TokenLoader(parts, 16, 10, 5, seed=2, dp_rank=1, dp_size=2)
    assert resumed.load_state_dict(loader.state_dict()) is None
    assert torch.equal(global_inputs(resumed), global_inputs(loader)[5:])
    other = TokenLoader([Part("a", a, 0.5)], 16, 10, 5)
    assert "saved for the corpora ['a', 'b']" in other.load_state_dict(loader.state_dict())
    assert other.drawn == [int(loader.step * 10)]  # the one corpus left takes its share of what was drawn
    # eval shares the held-out sequences by weight too
    rows = torch.cat([x for x, _ in eval_batches(parts, 16, batch=10, n_batches=2)])
    assert (rows[:, 0] > 251).sum().item() == 6


def test_repeat_false_ends_at_the_first_exhausted_corpus():
    parts = [Part("big", stream(16 * 100 + 1), 1), Part("small", stream(16 * 10 + 1), 1)]
    loader = TokenLoader(parts, 16, global_batch=4, micro_batch=4, repeat=False)
    steps = 0
    while not loader.exhausted():
        loader.next_step()
        steps += 1
    assert steps == 5 and loader.drawn == [10, 10] and loader.exhausted() == "small"
    assert TokenLoader(parts, 16, 4, 4).exhausted() is None  # repeat=True: never


def test_document_indices_restart_at_each_eos():
    tokens = np.array([5, 6, 0, 7, 8, 9, 0, 0, 4, 3] * 4, dtype=np.uint16)
    (x, y, docs), = TokenLoader(tokens, 9, 1, 1, documents=0).next_step()
    expected = torch.cumsum(x == 0, dim=1)
    assert torch.equal(docs, expected) and docs.dtype == torch.long
    (_, _, eval_docs), = eval_batches(tokens, 9, 1, 1, documents=0)
    assert eval_docs.shape == (1, 9)


# ---------------------------------------------------------------- fine-tuning examples

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_prompt_completion_trains_on_the_completion_only(tmp_path):
    records = [{"prompt": "Q: 2+2?\nA:", "completion": " 4"}, {"text": "plain text trains everywhere"},
               {"prompt": "Q: name?\nA:", "completion": " shoal"}]
    write(tmp_path / "sft.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    prepare([str(tmp_path / "sft.jsonl")], "byte", str(tmp_path / "ds"), val_fraction=0.001)
    corpus = build(tmp_path / "ds", val_fraction=0.001)
    expected_ids, expected_mask = [], []
    for r in records:
        prompt, completion = r.get("prompt", ""), r.get("completion", r.get("text"))
        expected_ids += [*prompt.encode(), *completion.encode(), 0]
        expected_mask += [0] * len(prompt) + [1] * (len(completion) + 1)  # the closing eos is trained
    tokens = np.concatenate([everything(corpus.train), everything(corpus.val)])  # the last example is held out
    mask = np.concatenate([everything(corpus.train_mask), everything(corpus.val_mask)])
    assert tokens.tolist() == expected_ids and mask.tolist() == expected_mask
    tokens, mask = everything(corpus.train), everything(corpus.train_mask)
    # the loader keeps every token as an input and only the trained ones as targets
    n = len(tokens) - 1
    (x, y), = TokenLoader([Part("sft", corpus.train, 1, corpus.train_mask)], n, 1, 1).next_step()
    assert torch.equal(x[0], torch.from_numpy(tokens[:-1].astype(np.int64)))
    assert torch.equal(y[0] != -100, torch.from_numpy(mask[1:] == 1))
    # a micro-batch with no target left adds nothing (not NaN)
    from shoal.model.transformer import cross_entropy

    logits = torch.randn(1, 3, 256, requires_grad=True)
    loss = cross_entropy(logits, torch.full((1, 3), -100))
    loss.backward()
    assert loss.item() == 0 and logits.grad.abs().sum() == 0


def test_chat_messages_are_masked_through_the_template():
    from shoal.data.chat import render

    chat = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "Bye."})
    segments = render((CHATML, {}), chat, "chat.jsonl:1")
    assert [t for t, trained in segments if trained] == ["Hello.<|im_end|>\n", "Bye.<|im_end|>\n"]
    assert "".join(t for t, _ in segments) == "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in chat)
    with pytest.raises(UserError, match="need the tokenizer's chat template"):
        render(None, chat, "chat.jsonl:1")
    with pytest.raises(UserError, match="no assistant message"):
        render((CHATML, {}), chat[:2], "chat.jsonl:1")
    unstable = "{% for m in messages %}{{ m.content }}{% endfor %}{{ messages | length }}"
    with pytest.raises(UserError, match="renders a conversation's start differently"):
        render((unstable, {}), chat, "chat.jsonl:1")


def test_a_chat_template_that_does_not_parse_is_one_line():
    # a hand-edited tokenizer_config.json: jinja's TemplateSyntaxError was a traceback from shoal train
    # and shoal data prepare
    from shoal.data.chat import render

    chat = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."})
    with pytest.raises(UserError, match=r"chat template .* does not parse \(unexpected '}'\)") as e:
        render(("{% for m in messages %}{{ m.content }", {}), chat, "chat.jsonl:1")
    assert (e.value.field, e.value.value) == ("data.tokenizer", "chat.jsonl:1")


def test_chat_records_prepare_with_the_tokenizers_template(tmp_path, hf_tokenizer_path):
    import shutil

    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(hf_tokenizer_path, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))
    chat = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}
    write(tmp_path / "chat.jsonl", json.dumps(chat) + "\n")
    prepare([str(tmp_path / "chat.jsonl")], str(folder / "tokenizer.json"), str(tmp_path / "ds"))
    (record,) = open_dataset(str(tmp_path / "ds")).shards
    from shoal.config import load_config

    taken = load_config(None, [f"data.path={tmp_path / 'ds'}"]).data  # the dataset brings its tokenizer
    assert taken.tokenizer == str(tmp_path / "ds" / "tokenizer.json") and taken.val_fraction == 0.01
    assert record.loss_mask and 0 < np.fromfile(tmp_path / "ds" / "shards" / f"{record.key}.mask", np.uint8).sum() < record.tokens
    with pytest.raises(UserError, match="need the tokenizer's chat template") as e:
        prepare([str(tmp_path / "chat.jsonl")], hf_tokenizer_path, str(tmp_path / "ds2"))
    assert "chat.jsonl:1" in str(e.value)
