"""shoal plan reads any decoder config's shape (model/hf_shape.py); shoal train still refuses what it does not compute."""

import json

import pytest

from shoal.errors import UserError
from shoal.model.analytics import param_counts
from shoal.model.hf_config import hf_config_to_model_config
from shoal.model.hf_shape import SHAPE_NOTE, hf_config_to_shape

GPT_OSS_120B = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
                "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
                "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18, "attention_bias": True}
GPT_NEOX_20B = {"model_type": "gpt_neox", "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
                "intermediate_size": 24576, "vocab_size": 50432, "max_position_embeddings": 2048,
                "tie_word_embeddings": False, "hidden_act": "gelu"}

KIMI_K2 = {"model_type": "kimi_k2", "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384,
           "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 512,
           "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "vocab_size": 163840, "tie_word_embeddings": False}

LLAMA4_MAVERICK = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 202048, "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2}}

BLOOM = {"model_type": "bloom", "n_embed": 14336, "n_head": 112, "n_layer": 70, "vocab_size": 250880}
NEMOTRON4_15B = {"model_type": "nemotron", "hidden_size": 6144, "intermediate_size": 24576, "num_attention_heads": 48,
                 "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 256000, "hidden_act": "relu2"}
GEMMA2_27B = {"model_type": "gemma2", "hidden_size": 4608, "intermediate_size": 36864, "num_attention_heads": 32,
              "num_key_value_heads": 16, "head_dim": 128, "num_hidden_layers": 46, "vocab_size": 256000}

DBRX = {"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40, "max_seq_len": 32768, "vocab_size": 100352,
        "attn_config": {"kv_n_heads": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4}}


@pytest.mark.parametrize("hf,total,active", [
    (GPT_OSS_120B, 116.8e9, None),  # its model card: 116.8B parameters
    (GPT_NEOX_20B, 20.6e9, None),   # Black et al. 2022: 20.6B (a two-matrix GeLU MLP; gated it would be 27B)
    (KIMI_K2, 1.03e12, 32.9e9),     # its model card: 1T, 32B activated (DeepSeek-V3's latent attention, 384 experts)
    (LLAMA4_MAVERICK, 400e9, 17.2e9),  # Meta's: 400B, 17B active (MoE every second layer, one shared expert)
    (DBRX, 132e9, 36.5e9),          # Databricks': 132B, 36B active (heads and experts in nested blocks)
    (BLOOM, 176.2e9, None),         # BigScience's 176B (its config.json says n_embed)
    (NEMOTRON4_15B, 15.6e9, None),  # Parmar et al. 2024: 15B, a squared-ReLU MLP of two matrices
    (GEMMA2_27B, 27.2e9, None),     # its card: 27.2B (Gemma ties the head by its config class's default)
])
def test_a_family_shoal_does_not_compute_is_planned_by_its_shape(hf, total, active):
    cfg = hf_config_to_shape(hf)
    assert cfg.note.startswith(SHAPE_NOTE)
    assert param_counts(cfg).total == pytest.approx(total, rel=0.01)
    if active:
        assert param_counts(cfg).active == pytest.approx(active, rel=0.01)
    with pytest.raises(UserError, match="model_type"):  # shoal train still starts only from what it computes
        hf_config_to_model_config(hf.get("text_config", hf))


def test_arctics_dense_residual_mlp_is_planned_as_a_shared_expert():
    arctic = {"model_type": "arctic", "hidden_size": 7168, "intermediate_size": 4864, "num_attention_heads": 56,
              "num_key_value_heads": 8, "num_hidden_layers": 35, "num_local_experts": 128, "num_experts_per_tok": 2,
              "vocab_size": 32000, "parallel_attn_mlp_res": True, "moe_layer_frequency": 1}
    counts = param_counts(hf_config_to_shape(arctic))
    # Snowflake's card: 480B, 17B active (a 10B dense transformer beside 128 x 3.66B experts, top-2). The residual
    # MLP is hidden_size wide, 1.47 routed experts, planned as one: 15.6B active, where it was 11.9B without it.
    assert counts.total == pytest.approx(480e9, rel=0.01)
    assert counts.active == pytest.approx(17e9, rel=0.1) and counts.active > 15e9


def test_a_model_with_no_attention_is_refused_and_moe_periods_are_read():
    with pytest.raises(UserError, match="no attention layers"):
        hf_config_to_shape({"model_type": "mamba2", "hidden_size": 2560, "num_hidden_layers": 64, "num_heads": 80,
                            "vocab_size": 50288})
    jamba = {"model_type": "jamba", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_experts": 16, "num_experts_per_tok": 2, "expert_layer_period": 2,
             "vocab_size": 65536}
    assert hf_config_to_shape(jamba).n_moe_layers == 16  # an MoE layer every second one


def test_layers_of_other_kinds_are_named_in_the_note():
    # Qwen3-Next's linear attention and Nemotron-H's Mamba mixers plan as transformer layers, and the note says so
    qwen3_next = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16,
                  "intermediate_size": 5120, "vocab_size": 151936,
                  "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2}
    nemotron_h = {"model_type": "nemotron_h", "hidden_size": 4096, "num_hidden_layers": 8, "num_attention_heads": 32,
                  "intermediate_size": 21504, "vocab_size": 131072, "hybrid_override_pattern": "M-M*-M-"}
    assert "(linear_attention)" in hf_config_to_shape(qwen3_next).note
    assert "(mamba, mlp)" in hf_config_to_shape(nemotron_h).note


def test_a_config_without_a_shape_is_one_line_naming_the_field(tmp_path, capsys):
    from shoal.cli.main import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt_oss", "num_hidden_layers": 4}))
    assert main(["plan", "--model", str(tmp_path), "--seq-len", "256", "--global-batch", "8", "--gpu", "h100",
                 "--gpus", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hidden_size" in err[0]


@pytest.mark.parametrize("odd", [{"rope_theta": "abc"}, {"shared_expert_intermediate_size": "x", "num_experts": 4},
                                 {"intermediate_size": float("inf")}])
def test_a_value_of_the_wrong_type_is_read_as_absent(odd):
    """Each raised a ValueError, TypeError or OverflowError: plan reads any family's shape, so a field it
    cannot read is left out, as a missing one is."""
    assert hf_config_to_shape({**GPT_NEOX_20B, **odd}).note.startswith(SHAPE_NOTE)


def test_a_multimodal_folder_plans_its_language_model():
    gemma3_27b = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 5376, "num_hidden_layers": 62, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 21504, "vocab_size": 262208}}
    cfg = hf_config_to_shape(gemma3_27b)
    assert (cfg.dim, cfg.n_layers, cfg.qk_norm) == (5376, 62, True)


@pytest.mark.parametrize("hf,window,varies", [
    # config.json files saved before transformers wrote layer_types: Gemma 2's alternation is its class's default,
    # Gemma 3 says every 6th layer is global; kept as one window, they would plan the global layers' attention short
    ({**GEMMA2_27B, "sliding_window": 4096}, 0, True),
    ({**GEMMA2_27B, "model_type": "gemma3_text", "sliding_window": 1024, "sliding_window_pattern": 6}, 0, True),
    # Qwen's MoE configs name a window and turn it off
    ({**GEMMA2_27B, "model_type": "qwen2_moe", "sliding_window": 4096, "use_sliding_window": False}, 0, False),
    ({**GEMMA2_27B, "model_type": "phi3", "sliding_window": 2047}, 2047, False),  # one window for every layer
])
def test_sliding_windows_as_older_configs_say_them(hf, window, varies):
    cfg = hf_config_to_shape(hf)
    assert cfg.sliding_window == window
    assert ("(sliding_attention) planned as full-attention" in cfg.note) == varies
