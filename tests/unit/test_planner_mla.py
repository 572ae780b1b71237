"""Multi-head latent attention (DeepSeek-V2 §2.1): planned from its own widths, refused by shoal train."""

import pytest

from shoal import hardware
from shoal.config import load_config
from shoal.errors import UserError
from shoal.job import resolve
from shoal.layout import Layout, TrainerLimit
from shoal.layout_rules import model_limits, problems
from shoal.model import analytics
from shoal.model.config import PRESETS
from shoal.model.hf_config import hf_config_to_model_config
from shoal.planner.evaluate import evaluate
from shoal.planner.timing import experts_reach
from shoal.planner.workload import Cluster, Workload

V3 = PRESETS["deepseek-v3"]


def test_deepseek_presets_have_their_published_sizes():
    # DeepSeek-V3 report: 671B total, 37B activated (the MTP module apart); DeepSeek-V2 paper: 236B, 21B.
    for name, total, active in (("deepseek-v3", 671e9, 37e9), ("deepseek-v2", 236e9, 21e9)):
        counts = analytics.param_counts(PRESETS[name].validate())
        assert abs(counts.total / total - 1) < 0.01 and abs(counts.active / active - 1) < 0.03, name
    assert round(analytics.attention_params(V3) / 1e6, 1) == 187.1  # per layer, from the config's widths


def test_attention_core_counts_mla_widths():
    # QK^T over 192-wide heads and PV over 128-wide: 2.86x the core of plain 56-wide heads (7168 / 128).
    plain = V3.replace(head_dim=0, kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0, v_head_dim=0)
    assert analytics.attention_core_width(V3) / analytics.attention_core_width(plain) == pytest.approx(160 / 56)
    llama = PRESETS["llama3-8b"]
    assert analytics.attention_core_width(llama) == llama.n_heads * llama.head_size  # unchanged without MLA


def test_tensor_parallel_splits_the_heads_not_the_latents():
    latent, heads = analytics.mla_params(V3)
    assert analytics.attention_params_per_rank(V3, 8) == latent + heads / 8


def test_light_recompute_drops_the_up_projection_outputs():
    # DeepSeek-V3 §3.3: RMSNorm and the MLA up-projections are recomputed, so q, k, v are not kept.
    kw = dict(layer=0, fused=True)
    none = analytics.activation_bytes_per_layer(V3, 4096, 1, **kw)
    light = analytics.activation_bytes_per_layer(V3, 4096, 1, recompute="selective", **kw)
    assert none - light >= 4096 * 2 * V3.n_heads * (2 * V3.head_size + V3.v_head_size)
    assert analytics.recompute_flops_per_token(V3, 4096, "selective") == V3.n_layers * analytics.mla_up_flops(V3)


def test_mla_fields_are_checked():
    with pytest.raises(UserError, match="qk_rope_head_dim"):
        PRESETS["debug"].replace(qk_rope_head_dim=4).validate()  # without kv_lora_rank
    with pytest.raises(UserError, match="n_kv_heads"):
        PRESETS["debug"].replace(kv_lora_rank=8, qk_rope_head_dim=4, head_dim=16).validate()  # 2 kv heads of 4


def test_planner_plans_mla_and_shoal_train_refuses_it():
    lay = Layout(dp_shard=16, pp=16, ep=8, zero=1, micro_batch=1, pp_schedule="1f1b")
    wl = Workload(V3, 4096, 2048, precision="fp8")
    found = problems(lay, V3, 256, 2048, 4096)
    assert "model.kv_lora_rank" in [p.field for p in found if isinstance(p, TrainerLimit)]
    assert evaluate(wl, lay, Cluster(hardware.get_gpu("b200"), 256, 8)).fits
    sets = ["model.preset=debug", "model.n_kv_heads=4", "model.head_dim=16", "model.kv_lora_rank=8",
            "model.qk_rope_head_dim=4", "train.global_batch=8"]
    with pytest.raises(UserError) as e:  # the job is refused while it is resolved, before any worker starts
        resolve(load_config(None, sets), 1)
    assert e.value.field == "model.kv_lora_rank" and e.value.value == 8


def test_deepseek_hf_config_imports_as_the_preset():
    # deepseek-ai/DeepSeek-V3's config.json (the shape keys; its yarn rope_scaling left out here).
    hf = {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
          "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
          "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
          "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "norm_topk_prob": True,
          "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu", "n_group": 8, "topk_group": 4,
          "topk_method": "noaux_tc"}
    cfg = hf_config_to_model_config(hf)
    shape = ("head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "n_experts", "top_k",
             "expert_ffn_hidden", "n_shared_experts", "n_dense_layers", "dim", "n_layers", "ffn_hidden",
             "expert_groups", "expert_groups_per_token")
    assert {f: getattr(cfg, f) for f in shape} == {f: getattr(V3, f) for f in shape}
    assert analytics.param_counts(cfg).total == analytics.param_counts(V3).total
    with pytest.raises(UserError, match="moe_layer_freq"):
        hf_config_to_model_config({**hf, "moe_layer_freq": 2})
    # V2-Lite's greedy routing and Kimi K2's one group limit nothing
    assert hf_config_to_model_config({**hf, "topk_method": "greedy"}).expert_groups == 0
    assert hf_config_to_model_config({**hf, "n_group": 1, "topk_group": 1}).expert_groups == 0


def test_group_limited_routing_bounds_the_nodes_a_token_reaches():
    # DeepSeek-V3 §3.2.2: a token goes to at most 4 nodes (its 4 of 8 groups, a node's experts each at EP 64)
    assert experts_reach(V3, 8) == pytest.approx(3.63, abs=0.01) and experts_reach(V3, 8) <= 4
    uniform = V3.replace(expert_groups=0, expert_groups_per_token=0)
    assert experts_reach(uniform, 8) == pytest.approx(5.29, abs=0.01)
    assert experts_reach(V3, 1) == 1.0 and experts_reach(V3, 4) < experts_reach(uniform, 4)
    assert model_limits(V3.replace(kv_lora_rank=0, q_lora_rank=0, qk_rope_head_dim=0, v_head_dim=0, head_dim=0,
                                   n_kv_heads=8))[0].field == "model.expert_groups"  # shoal train refuses it
    for bad in (dict(expert_groups=7), dict(expert_groups_per_token=9), dict(expert_groups=0),
                dict(expert_groups=64, expert_groups_per_token=1)):  # 4 experts for top_k 8
        with pytest.raises(UserError, match="expert_groups"):
            V3.replace(**bad).validate()
