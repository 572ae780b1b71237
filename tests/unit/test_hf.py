"""Hugging Face Llama import/export: logits match transformers both ways; refusals are UserErrors."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from shoal.errors import UserError
from shoal.model.config import ModelConfig, get_preset
from shoal.model.hf import (
    hf_config_to_model_config,
    hf_to_shoal_name,
    load_hf_llama,
    model_config_to_hf_config,
    save_hf_llama,
    shoal_to_hf_name,
)
from shoal.model.transformer import build_model

TOL = 1e-4  # fp32 on CPU: the two implementations differ only in summation order
SMALL_HF = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                rms_norm_eps=1e-5, rope_theta=50000.0)


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))


def randomize_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Norm weights start at 1 in both libraries, which would hide two norms swapped by the mapping."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return model


def hf_llama(transformers, seed=0, **overrides):
    """A small random LlamaForCausalLM in fp32 with the naive (eager) attention as the reference."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**SMALL_HF, **overrides}, attn_implementation="eager")
    return randomize_norms(transformers.LlamaForCausalLM(config).float().eval())


def max_logit_diff(hf_model, shoal_model, tokens) -> float:
    with torch.no_grad():
        return (hf_model(tokens).logits - shoal_model(tokens)).abs().max().item()


# ---------------------------------------------------------------------------------------------
# Logit parity


@pytest.mark.parametrize("overrides", [
    pytest.param({}, id="gqa"),
    pytest.param({"num_key_value_heads": 4, "tie_word_embeddings": True}, id="mha-tied"),
])
def test_hf_to_shoal_logits_match(transformers, tokens, tmp_path, overrides):
    hf_model = hf_llama(transformers, **overrides)
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_llama(tmp_path)
    assert model.cfg.n_kv_heads == hf_model.config.num_key_value_heads
    assert model.cfg.tie_embeddings == hf_model.config.tie_word_embeddings
    if model.cfg.tie_embeddings:
        assert model.output.weight is model.tok_embeddings.weight
    assert max_logit_diff(hf_model, model, tokens) <= TOL


def test_sharded_checkpoint_loads(transformers, tokens, tmp_path):
    hf_model = hf_llama(transformers, seed=1)
    hf_model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    assert max_logit_diff(hf_model, load_hf_llama(tmp_path), tokens) <= TOL


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_shoal_to_hf_logits_match(transformers, tokens, tmp_path, tied):
    cfg = get_preset("debug").replace(n_layers=3, tie_embeddings=tied, rope_theta=20000.0)
    model = randomize_norms(build_model(cfg, seed=3).eval())
    save_hf_llama(model, cfg, tmp_path)
    assert ("lm_head.weight" in load_file(tmp_path / "model.safetensors")) == (not tied)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert hf_model.dtype == torch.float32
    assert hf_model.config.tie_word_embeddings == tied
    assert max_logit_diff(hf_model, model, tokens) <= TOL


def test_state_dict_export_round_trips(tmp_path, tokens):
    cfg = get_preset("debug")
    model = build_model(cfg, seed=4).eval()
    save_hf_llama(model.state_dict(), cfg, tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    back = load_hf_llama(tmp_path)  # cast back to fp32
    assert back.tok_embeddings.weight.dtype == torch.float32
    with torch.no_grad():
        assert (back(tokens) - model(tokens)).abs().max() < 0.05  # bf16 rounding of the weights only


# ---------------------------------------------------------------------------------------------
# Config and names


def test_config_round_trip_through_llama_config(transformers):
    cfg = ModelConfig(vocab_size=300, dim=96, n_layers=3, n_heads=6, n_kv_heads=2, ffn_hidden=200,
                      max_seq_len=128, rope_theta=123456.0, norm_eps=1e-6, tie_embeddings=True)
    hf = model_config_to_hf_config(cfg)
    assert hf_config_to_model_config(hf) == cfg
    # What transformers itself writes back out reads the same (transformers 5 moves rope_theta).
    assert hf_config_to_model_config(transformers.LlamaConfig(**hf).to_dict()) == cfg
    assert hf_config_to_model_config(transformers.LlamaConfig(**hf)) == cfg  # the object itself


@pytest.mark.parametrize("rope", [
    {"rope_theta": 7.0},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 7.0}},
    {"rope_theta": 1.0, "rope_scaling": {"type": "default", "rope_theta": 7.0}},
])
def test_rope_theta_found_wherever_it_is(rope):
    assert hf_config_to_model_config({**SMALL_HF, "rope_theta": None, **rope}).rope_theta == 7.0


def test_llama_defaults_apply():
    minimal = {k: SMALL_HF[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                        "num_hidden_layers", "num_attention_heads")}
    cfg = hf_config_to_model_config(minimal)
    got = (cfg.n_kv_heads, cfg.max_seq_len, cfg.norm_eps, cfg.rope_theta, cfg.tie_embeddings)
    assert got == (4, 2048, 1e-6, 1e4, False)


def test_every_parameter_name_maps_both_ways():
    for name, _ in build_model(get_preset("debug"), device="meta").named_parameters():
        assert hf_to_shoal_name(shoal_to_hf_name(name)) == name
    assert hf_to_shoal_name("model.layers.0.mlp.gate_proj.weight") == "layers.0.feed_forward.w1.weight"
    assert hf_to_shoal_name("model.layers.0.mlp.gate_proj.bias") is None


@pytest.mark.parametrize("change, field", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "hf.rope_scaling"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "hf.rope_parameters"),
    ({"attention_bias": True}, "hf.attention_bias"),
    ({"mlp_bias": True}, "hf.mlp_bias"),
    ({"hidden_act": "gelu"}, "hf.hidden_act"),
    ({"head_dim": 32}, "hf.head_dim"),
    ({"num_key_value_heads": 3}, "hf.num_key_value_heads"),
    ({"model_type": "mistral"}, "hf.model_type"),
    ({"intermediate_size": None}, "hf.intermediate_size"),
])
def test_unsupported_hf_config_refused(change, field):
    hf = {**SMALL_HF, **change}
    if hf["intermediate_size"] is None:
        del hf["intermediate_size"]
    with pytest.raises(UserError) as err:
        hf_config_to_model_config(hf)
    assert err.value.field == field


@pytest.mark.parametrize("preset, field", [("debug-moe", "model.n_experts"), ("gpt3-175b", "model.mlp")])
def test_export_refuses_what_llama_cannot_hold(tmp_path, preset, field):
    with pytest.raises(UserError) as err:
        save_hf_llama({}, get_preset(preset), tmp_path)
    assert err.value.field == field
    assert not any(tmp_path.iterdir())  # refused before writing anything


# ---------------------------------------------------------------------------------------------
# Broken directories


@pytest.fixture
def exported(tmp_path):
    cfg = get_preset("debug").replace(n_layers=2)
    return save_hf_llama(build_model(cfg, seed=0), cfg, tmp_path / "export")


def test_missing_tensor_named(exported):
    tensors = load_file(exported / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"lacks .*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_llama(exported)


def test_unexpected_tensor_named(exported):
    tensors = load_file(exported / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    tensors["model.layers.5.input_layernorm.weight"] = torch.ones(64)  # a layer the config lacks
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"q_proj\.bias.*layers\.5\.input_layernorm"):
        load_hf_llama(exported)


def test_wrong_shape_named(exported):
    tensors = load_file(exported / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError) as err:
        load_hf_llama(exported)
    assert err.value.field == "hf.model.norm.weight"


def test_pickle_only_directory_refused(exported):
    (exported / "model.safetensors").rename(exported / "pytorch_model.bin")
    with pytest.raises(UserError, match="never loads"):
        load_hf_llama(exported)
