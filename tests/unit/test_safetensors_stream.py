"""The streaming safetensors writer (checkpoint/safetensors_stream.py) against safetensors' own
save_model: same tensors, same names kept for tied weights, same metadata, readable by its loaders."""

import dataclasses

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_model

from shoal.checkpoint.final_export import file_layout
from shoal.checkpoint.safetensors_stream import SafetensorsStream
from shoal.model.config import PRESETS
from shoal.model.transformer import build_model


@pytest.mark.parametrize("tied", [False, True])
def test_streamed_file_reads_like_save_model(tmp_path, tied):
    cfg = dataclasses.replace(PRESETS["debug"], tie_embeddings=tied)
    model = build_model(cfg, seed=3)
    save_model(model, str(tmp_path / "reference.safetensors"))
    specs, dropped = file_layout(cfg)
    state = model.state_dict()
    with SafetensorsStream(tmp_path / "streamed.safetensors", specs, dropped) as f:
        for name in specs:
            f.write(name, state[name])
    reference, streamed = load_file(tmp_path / "reference.safetensors"), load_file(tmp_path / "streamed.safetensors")
    assert sorted(specs) == sorted(reference)  # the tied weight kept once, under the same name
    assert sorted(streamed) == sorted(reference)
    assert all(torch.equal(streamed[k], reference[k]) for k in reference)  # bit for bit
    with safe_open(tmp_path / "reference.safetensors", "pt") as a, safe_open(tmp_path / "streamed.safetensors", "pt") as b:
        assert a.metadata() == b.metadata()
    fresh = build_model(cfg, seed=99)
    load_model(fresh, str(tmp_path / "streamed.safetensors"))  # strict: every parameter found
    assert all(torch.equal(p, q) for p, q in zip(fresh.parameters(), model.parameters()))


def test_mixed_dtypes_and_no_torn_file(tmp_path):
    specs = {"a": ((3, 5), torch.bfloat16), "b": ((), torch.int64), "c": ((7,), torch.float32)}
    values = {"a": torch.randn(3, 5).bfloat16(), "b": torch.tensor(42), "c": torch.randn(7)}
    with SafetensorsStream(tmp_path / "x.safetensors", specs) as f:
        for name in specs:
            f.write(name, values[name])
    assert all(torch.equal(load_file(tmp_path / "x.safetensors")[k], v) for k, v in values.items())
    with pytest.raises(AssertionError, match="1 tensors never written"):
        with SafetensorsStream(tmp_path / "y.safetensors", specs) as f:
            f.write("a", values["a"])
            f.write("b", values["b"])
    assert not (tmp_path / "y.safetensors").exists()  # only the .partial file, never a torn one
