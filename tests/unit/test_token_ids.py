"""A tokenizer's largest id, not its token count, sizes the model and the token cache: a vocabulary
that skips ids (29 tokens, the largest id 70,000) was stored modulo 65,536 and trained on, and the
end-of-run sample then died with an IndexError."""

import json

import numpy as np
import pytest

from shoal.config import DataConfig, load_config
from shoal.data.corpus import load_data
from shoal.data.tokenizer import load_tokenizer
from shoal.errors import UserError


def sparse_tokenizer(path, largest: int) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate("abc")}, "def": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    # The id written into the file, as a hand edit would: building it in memory takes seconds per 2**31.
    record = json.loads(path.read_text())
    record["model"]["vocab"]["def"] = largest
    path.write_text(json.dumps(record))
    return str(path)


def test_ids_past_uint16_are_stored_whole_and_size_the_model(tmp_path):
    spec = sparse_tokenizer(tmp_path / "tokenizer.json", 70_000)
    tokenizer = load_tokenizer(spec)
    assert tokenizer.vocab_size == 70_001  # 6 tokens, but the embedding needs a row for id 70,000
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("def a b c " * 50)
    data = DataConfig(path=str(tmp_path / "corpus"), tokenizer=spec, cache_dir=str(tmp_path / "cache"))
    (corpus,) = load_data(data, 70_016)[1]
    tokens = corpus.train.read(0, len(corpus.train))
    assert tokens.dtype == np.uint32 and int(np.max(tokens)) == 70_000
    cfg = load_config(None, [f"data.tokenizer={spec}", f"data.path={tmp_path / 'corpus'}"])
    assert cfg.model.vocab_size == 70_016  # rounded up to a multiple of 128
    with pytest.raises(UserError, match="token ids up to 70000 but model.vocab_size=256"):
        load_data(load_config(None, [f"data.tokenizer={spec}", "model.vocab_size=256"]).data, 256)


def test_ids_past_what_an_embedding_may_hold_are_refused_naming_the_tokenizer(tmp_path):
    spec = sparse_tokenizer(tmp_path / "tokenizer.json", 2**31 + 5)
    with pytest.raises(UserError, match="largest token id is 2,147,483,653") as e:
        load_config(None, [f"data.tokenizer={spec}"])
    assert e.value.field == "data.tokenizer"
