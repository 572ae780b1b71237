"""Hugging Face import/export for every family shoal computes: logits match transformers both ways,
configs round-trip, and what shoal cannot compute is one UserError naming the field."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from shoal.errors import UserError
from shoal.model.config import ModelConfig, get_preset
from shoal.model.hf import hf_to_shoal_name, load_hf, save_hf, shoal_to_hf_name
from shoal.model.hf_config import export_family, hf_config_to_model_config, model_config_to_hf_config
from shoal.model.transformer import build_model

TOL = 1e-4  # fp32 on CPU: the two implementations differ only in summation order
SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=50000.0)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
FAMILIES = {  # id -> (model_type, config changes): one small random model of each kind shoal loads
    "llama-gqa": ("llama", {}),
    "llama-tied-mha": ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "llama3.1-rope-head-dim": ("llama", {"rope_parameters": LLAMA3, "head_dim": 24}),
    "llama-linear-rope": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 5e4, "factor": 4.0}}),
    "llama-yarn-rope": ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e4, "factor": 4.0,
                                                      "original_max_position_embeddings": 16}}),
    "mistral-window": ("mistral", {"sliding_window": 8}),
    "mistral-no-window": ("mistral", {"sliding_window": None}),
    "qwen2-bias": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3-qk-norm": ("qwen3", {"head_dim": 32}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48}),
    "qwen3-moe": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                "norm_topk_prob": True, "head_dim": 16}),
    "qwen3-moe-dense-first": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                            "norm_topk_prob": False, "mlp_only_layers": [0], "num_hidden_layers": 3}),
}


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))


def randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Norms start at 1 and biases at 0 in both libraries, which would hide two of them swapped."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


def hf_model(transformers, family: str, seed: int = 0):
    """A small random model of `family` in fp32, with the naive (eager) attention as the reference."""
    model_type, changes = FAMILIES[family]
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, **{**SMALL, **changes}, attn_implementation="eager")
    return randomize(transformers.AutoModelForCausalLM.from_config(config).float().eval())


def max_logit_diff(hf, shoal, tokens) -> float:
    with torch.no_grad():
        return (hf(tokens).logits - shoal(tokens)).abs().max().item()


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_to_shoal_and_back(transformers, tokens, tmp_path, family):
    """transformers' model -> save_pretrained -> shoal: the same logits; shoal -> save_hf -> transformers'
    from_pretrained: the same family, config and logits again."""
    hf = hf_model(transformers, family)
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    model = load_hf(tmp_path / "hf")
    assert max_logit_diff(hf, model, tokens) <= TOL
    if model.cfg.tie_embeddings:
        assert model.output.weight is model.tok_embeddings.weight
    save_hf(model, model.cfg, tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == FAMILIES[family][0] or (family == "mistral-no-window" and config["model_type"] == "llama")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    assert type(again).__name__ == config["architectures"][0] and again.dtype == torch.float32
    assert max_logit_diff(again, model, tokens) <= TOL
    assert load_hf(tmp_path / "back").cfg == model.cfg  # shoal's per-expert export reads back too


def test_sharded_checkpoint_loads(transformers, tokens, tmp_path):
    hf = hf_model(transformers, "llama-gqa", seed=1)
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*-of-*.safetensors"))) > 1
    assert max_logit_diff(hf, load_hf(tmp_path), tokens) <= TOL


def test_a_slice_reads_what_the_whole_tensor_holds(transformers, tmp_path):
    """What a rank reads of a tensor (its shard) is that part of the whole, for plain and for stacked experts."""
    from shoal.model.hf import HFWeights

    for family in ("qwen3-qk-norm", "mixtral"):
        hf_model(transformers, family).save_pretrained(tmp_path / family, safe_serialization=True)
        model = load_hf(tmp_path / family)
        weights = HFWeights(tmp_path / family, model.cfg)
        for name, p in model.named_parameters():
            index = tuple(slice(n // 3, n - n // 4) for n in p.shape)
            assert torch.equal(weights.read(name, index), p.detach()[index]), name


def test_state_dict_export_round_trips(tmp_path, tokens):
    cfg = get_preset("debug")
    model = build_model(cfg, seed=4).eval()
    save_hf(model.state_dict(), cfg, tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    back = load_hf(tmp_path)  # cast back to fp32
    assert back.tok_embeddings.weight.dtype == torch.float32
    with torch.no_grad():
        assert (back(tokens) - model(tokens)).abs().max() < 0.05  # bf16 rounding of the weights only


# ---------------------------------------------------------------------------------------------
# Config and names


@pytest.mark.parametrize("family", FAMILIES)
def test_config_round_trips_through_the_familys_own_config(transformers, family):
    """What shoal writes reads back the same, also after transformers' config object rewrote it."""
    model_type, changes = FAMILIES[family]
    cfg = hf_config_to_model_config({"model_type": model_type, **SMALL, **changes})
    hf = model_config_to_hf_config(cfg)
    assert hf_config_to_model_config(hf) == cfg
    rewritten = transformers.AutoConfig.for_model(hf["model_type"], **{k: v for k, v in hf.items() if k != "model_type"})
    assert hf_config_to_model_config(rewritten.to_dict()) == cfg


@pytest.mark.parametrize("rope", [
    {"rope_theta": 7.0},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 7.0}},
    {"rope_theta": 1.0, "rope_scaling": {"type": "default", "rope_theta": 7.0}},
])
def test_rope_theta_found_wherever_it_is(rope):
    assert hf_config_to_model_config({**SMALL, "rope_theta": None, **rope}).rope_theta == 7.0


def test_llama_defaults_apply():
    minimal = {k: SMALL[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                     "num_attention_heads")}
    cfg = hf_config_to_model_config(minimal)
    got = (cfg.n_kv_heads, cfg.max_seq_len, cfg.norm_eps, cfg.rope_theta, cfg.tie_embeddings)
    assert got == (4, 2048, 1e-6, 1e4, False)


def test_every_parameter_name_maps_both_ways():
    cfg = get_preset("debug").replace(qkv_bias=True, qk_norm=True)
    for name, _ in build_model(cfg, device="meta").named_parameters():
        assert hf_to_shoal_name(shoal_to_hf_name(name)) == name
    assert hf_to_shoal_name("model.layers.0.mlp.gate_proj.weight") == "layers.0.feed_forward.w1.weight"
    assert hf_to_shoal_name("model.layers.0.mlp.gate_proj.bias") == "layers.0.feed_forward.w1.bias"  # none exists
    assert shoal_to_hf_name("layers.1.feed_forward.router.weight", "mixtral") == "model.layers.1.block_sparse_moe.gate.weight"


@pytest.mark.parametrize("features, family", [
    ({}, "llama"), ({"sliding_window": 64}, "mistral"), ({"qkv_bias": True}, "qwen2"),
    ({"qk_norm": True, "head_dim": 32}, "qwen3"), ({"n_experts": 4}, "mixtral"),
    ({"n_experts": 4, "qk_norm": True, "router_renormalize": False}, "qwen3_moe"),
])
def test_the_family_follows_what_the_model_computes(features, family):
    assert export_family(get_preset("debug").replace(**features).validate()) == family


@pytest.mark.parametrize("change, field", [
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}}, "hf.rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}, "hf.rope_parameters"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "hf.rope_original_max_len"),
    ({"attention_bias": True}, "hf.attention_bias"),
    ({"mlp_bias": True}, "hf.mlp_bias"),
    ({"hidden_act": "gelu"}, "hf.hidden_act"),
    ({"head_dim": 31}, "hf.head_dim"),
    ({"num_key_value_heads": 3}, "hf.num_key_value_heads"),
    ({"model_type": "gemma"}, "hf.model_type"),
    ({"model_type": "qwen2", "use_sliding_window": True}, "hf.use_sliding_window"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [2],
      "num_hidden_layers": 4}, "hf.mlp_only_layers"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "hf.layer_types"),
    ({"intermediate_size": None}, "hf.intermediate_size"),
    # values of the wrong type or range, named before any arithmetic on them raised a TypeError,
    # a ZeroDivisionError, or looped over a typo's trillion layers
    ({"hidden_size": "64"}, "hf.hidden_size"),
    ({"num_attention_heads": 0}, "hf.num_attention_heads"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_hidden_layers": 10**12}, "hf.num_hidden_layers"),
    ({"model_type": "mistral", "sliding_window": "16"}, "hf.sliding_window"),
    ({"model_type": "mistral", "sliding_window": 16, "max_position_embeddings": None}, "hf.max_position_embeddings"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "decoder_sparse_step": 0}, "hf.decoder_sparse_step"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "mlp_only_layers": [0, "a"]}, "hf.mlp_only_layers"),
    ({"rope_theta": "abc"}, "hf.rope_theta"),
    # the expert fields by each family's own names: they were shoal's (hf.top_k)
    ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8}, "hf.num_experts_per_tok"),
    ({"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": "32"},
     "hf.moe_intermediate_size"),
    # what transformers computes and shoal would silently not: a top-level partial rotary factor
    # (transformers 5 moves it into rope_parameters), quantized weights
    ({"partial_rotary_factor": 0.5}, "hf.partial_rotary_factor"),
    ({"quantization_config": {"quant_method": "fp8"}}, "hf.quantization_config"),
])
def test_unsupported_hf_config_refused(change, field):
    hf = {**SMALL, **change}
    if hf["intermediate_size"] is None:
        del hf["intermediate_size"]
    # qwen3_moe: layers 0, 1 and 3 MoE, 2 dense, which no "every k-th after the first dense ones" gives
    with pytest.raises(UserError) as err:
        hf_config_to_model_config(hf)
    assert err.value.field == field


@pytest.mark.parametrize("preset, field", [("debug-moe", "model.n_shared_experts"), ("gpt3-175b", "model.mlp")])
def test_export_refuses_what_no_family_computes(tmp_path, preset, field):
    with pytest.raises(UserError) as err:
        save_hf({}, get_preset(preset), tmp_path)
    assert err.value.field == field
    assert not any(tmp_path.iterdir())  # refused before writing anything


def test_a_model_config_field_out_of_range_names_the_hf_field():
    with pytest.raises(UserError) as err:
        hf_config_to_model_config({**SMALL, "rope_parameters": {**LLAMA3, "low_freq_factor": 5.0}})
    assert err.value.field == "hf.rope_low_freq_factor"
    assert ModelConfig(head_dim=24).validate().head_size == 24 and ModelConfig().head_size == 16


# ---------------------------------------------------------------------------------------------
# Broken directories


@pytest.fixture
def exported(tmp_path):
    cfg = get_preset("debug").replace(n_layers=2)
    return save_hf(build_model(cfg, seed=0), cfg, tmp_path / "export")


def test_missing_tensor_named(exported):
    tensors = load_file(exported / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"lacks .*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf(exported)


def test_unexpected_tensor_named(exported):
    tensors = load_file(exported / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    tensors["model.layers.5.input_layernorm.weight"] = torch.ones(64)  # a layer the config lacks
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"q_proj\.bias.*layers\.5\.input_layernorm"):
        load_hf(exported)


def test_wrong_shape_named(exported):
    tensors = load_file(exported / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError) as err:
        load_hf(exported)
    assert err.value.field == "hf.model.norm.weight"


@pytest.mark.parametrize("dtype, stored", [(torch.float8_e4m3fn, "F8_E4M3"), (torch.int8, "I8"), (torch.bool, "BOOL")])
def test_weights_that_are_not_floating_point_are_refused_by_name(exported, dtype, stored):
    """FP8 weights with no quantization_config beside them were a NotImplementedError out of a worker
    (isfinite has no float8 kernel); integers and booleans were cast into a model that never existed."""
    tensors = load_file(exported / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"].to(dtype)
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="unquantized release") as err:
        load_hf(exported)
    assert (err.value.field, err.value.value) == ("hf.model.layers.1.mlp.up_proj.weight", stored)
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"].to(torch.bfloat16)
    save_file(tensors, exported / "model.safetensors", metadata={"format": "pt"})
    weight = dict(load_hf(exported).named_parameters())["layers.1.feed_forward.w3.weight"]
    assert weight.dtype == torch.float32  # a half-width weight is read, as float32


def test_an_index_naming_no_file_names_is_refused(exported):
    (exported / "model.safetensors").unlink()
    (exported / "model.safetensors.index.json").write_text('{"weight_map": {"model.norm.weight": 1}}')
    with pytest.raises(UserError, match="weight_map"):  # was a TypeError from Path / int
        load_hf(exported)


def test_a_config_with_a_byte_order_mark_loads(exported):
    config = exported / "config.json"
    config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())  # as Notepad saves it
    assert load_hf(exported).cfg.n_layers == 2


def test_pickle_only_directory_refused(exported):
    (exported / "model.safetensors").rename(exported / "pytorch_model.bin")
    with pytest.raises(UserError, match="never loads"):
        load_hf(exported)


def test_a_broken_link_to_the_weights_is_named(exported):
    """A Hub cache snapshot copied without its blobs/: it said the folder 'holds neither model.safetensors nor
    model.safetensors.index.json', beside the model.safetensors it lists."""
    (exported / "model.safetensors").unlink()
    (exported / "model.safetensors").symlink_to("../blobs/0123abcd")
    with pytest.raises(UserError, match=r"model\.safetensors is a broken symbolic link \(to \.\./blobs/0123abcd\)"):
        load_hf(exported)
