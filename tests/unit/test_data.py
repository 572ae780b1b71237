"""shoal.data: tokenizers, corpus sources, the token cache and the deterministic DP-sharded loader."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import torch

from shoal.data.loader import TokenLoader, eval_batches
from shoal.data.shards import build_token_cache, in_val, token_dtype
from shoal.data.sources import list_documents, read_documents
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
        build_token_cache(str(path), BYTE, tmp_path / "cache")


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
    write(tmp_path / "blank.jsonl", '{"text": ""}\n{"text": ""}\n')  # non-empty files, no text
    with pytest.raises(UserError, match="corpus is empty"):
        build_token_cache(str(tmp_path / "blank.jsonl"), BYTE, tmp_path / "cache")


# ---------------------------------------------------------------- token cache


def test_cache_built_once_then_reused(tmp_path, hf_tokenizer_path):
    d = corpus_dir(tmp_path)
    first = build_token_cache(d, BYTE, tmp_path / "cache")
    mtime = os.stat(first.path).st_mtime_ns
    again = build_token_cache(d, BYTE, tmp_path / "cache")
    assert first.built and not again.built
    assert again.path == first.path and os.stat(first.path).st_mtime_ns == mtime
    assert np.array_equal(first.train, again.train) and np.array_equal(first.val, again.val)
    assert first.train.dtype == np.uint16 and isinstance(first.train, np.memmap)
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([os.path.basename(first.path), os.path.basename(first.path) + ".lock"])

    # A different tokenizer or an edited file gets its own cache.
    hf = build_token_cache(d, load_tokenizer(hf_tokenizer_path), tmp_path / "cache")
    assert hf.built and hf.path != first.path
    write(os.path.join(d, "doc000.txt"), "edited")
    edited = build_token_cache(d, BYTE, tmp_path / "cache")
    assert edited.built and edited.path != first.path


@pytest.mark.parametrize("error, fix", [(OSError(28, "No space left on device"), "free space there"),
                                        (FileNotFoundError(2, "No such file or directory"), "folder was removed")])
def test_a_failed_cache_write_names_the_cause(tmp_path, monkeypatch, error, fix):
    """A full disk, or the cache folder deleted while the cache is written (a clean-up of $SHOAL_CACHE_DIR)."""
    import shoal.data.shards as shards

    def fail(*args):
        raise error

    monkeypatch.setattr(shards, "_build", fail)
    with pytest.raises(UserError, match="writing the token cache failed") as e:
        build_token_cache(corpus_dir(tmp_path), BYTE, tmp_path / "cache")
    assert fix in str(e.value) and ("free space" in str(e.value)) == (fix == "free space there")


def test_val_split_is_by_document(tmp_path):
    d = corpus_dir(tmp_path, n=200)
    cache = build_token_cache(d, BYTE, tmp_path / "cache", val_fraction=0.1)
    train, val = documents_of(cache.train), documents_of(cache.val)
    everything = sorted(open(os.path.join(d, f)).read() for f in os.listdir(d))
    assert sorted(train + val) == everything  # every document exactly once
    assert not set(train) & set(val)
    assert 0 < len(val) < len(train) and (cache.n_train_docs, cache.n_val_docs) == (len(train), len(val))
    # held-out documents are the ones whose name hashes into the val bucket
    held = {f"document {int(f[3:6])} " for f in os.listdir(d) if in_val(f, 0.1)}
    assert {v.split("lorem")[0] for v in val} == held


def test_val_split_never_empty(tmp_path):
    # Two documents, neither of which hashes into a 1% bucket: the tail document is held out.
    write(tmp_path / "two" / "a.txt", "alpha " * 50)
    write(tmp_path / "two" / "b.txt", "beta " * 50)
    cache = build_token_cache(str(tmp_path / "two"), BYTE, tmp_path / "cache")
    assert documents_of(cache.val) == ["beta " * 50] and documents_of(cache.train) == ["alpha " * 50]
    # One document: the split falls inside it, still with no token on both sides.
    single = write(tmp_path / "one.txt", "".join(f"line {i}\n" for i in range(1000)))
    cache = build_token_cache(single, BYTE, tmp_path / "cache")
    assert 0 < len(cache.val) < len(cache.train)
    stream = np.concatenate([cache.train, cache.val])
    assert BYTE.decode(stream) == open(single).read() and stream[-1] == 0
    no_val = build_token_cache(single, BYTE, tmp_path / "cache", val_fraction=0.0)
    assert len(no_val.val) == 0


def test_concurrent_builders_share_one_file(tmp_path):
    d = corpus_dir(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(build_token_cache(d, BYTE, tmp_path / "cache")))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.built for r in results) == [False, False, True]
    assert len({r.path for r in results}) == 1
    assert not [f for f in os.listdir(tmp_path / "cache") if f.endswith(".tmp")]


def test_token_dtype():
    assert token_dtype(256) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(128256) == np.uint32


def test_stdlib_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    cache = build_token_cache("stdlib", BYTE)
    assert cache.path.startswith(str(tmp_path / "tokens"))
    assert len(cache.train) > 1_000_000 and len(cache.val) > 1000
    assert "import" in BYTE.decode(cache.val[:100_000])
    names = [s.name for s in list_documents("stdlib")]
    assert names == sorted(names) and "os.py" in names
    assert not any(part in ("test", "tests", "site-packages") for n in names for part in n.split(os.sep))


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
    assert all(isinstance(v, int) for v in state.state_dict().values())
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
