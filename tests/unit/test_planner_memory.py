"""Planner memory model against the ZeRO paper (Table 1, exactly) and Korthikanti et al. (Table 2, Eq. 5/6)."""

import dataclasses
import math

import pytest

from shoal.model import analytics
from shoal.model.config import PRESETS, ModelConfig
from shoal.hardware.gpu import GiB
from shoal.hardware.lookup import get_gpu
from shoal.layout import Layout
from shoal.planner.workload import Cluster, Workload
from shoal.planner.memory import loss_bytes_per_logit, memory, model_state_bytes, stage_params
from shoal.planner.pipeline import inflight_layer_microbatches
from shoal.planner.search import Fixed, search

# ZeRO (Rajbhandari et al. 2020) Table 1: per-device model-state GB for (Ψ, stage) at each DP degree.
ZERO_TABLE1 = {
    # dp: (7.5B os, os+g, os+g+p, 128B os, os+g, os+g+p, 1T os, os+g, os+g+p)
    1: ("120", "120", "120", "2048", "2048", "2048", "16000", "16000", "16000"),
    4: ("52.5", "41.3", "30", "896", "704", "512", "7000", "5500", "4000"),
    16: ("35.6", "21.6", "7.5", "608", "368", "128", "4750", "2875", "1000"),
    64: ("31.4", "16.6", "1.88", "536", "284", "32", "4187", "2218", "250"),
    256: ("30.4", "15.4", "0.47", "518", "263", "8", "4046", "2054", "62.5"),
    1024: ("30.1", "15.1", "0.12", "513", "257", "2", "4011", "2013", "15.6"),
}


def _matches_printed(value: float, printed: str) -> bool:
    """The paper prints values rounded or truncated to the digits shown; either is an exact match."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    scale = 10 ** decimals
    half_up = math.floor(value * scale + 0.5 + 1e-9) / scale
    truncated = math.floor(value * scale + 1e-9) / scale
    return float(printed) in (half_up, truncated)


@pytest.mark.parametrize("dp", sorted(ZERO_TABLE1))
def test_zero_table1_exactly(dp):
    cells = iter(ZERO_TABLE1[dp])
    for psi in (7.5e9, 128e9, 1e12):
        for zero in (1, 2, 3):
            gb = sum(model_state_bytes(psi, dp, zero, "bf16")) / 1e9
            printed = next(cells)
            assert _matches_printed(gb, printed), (psi, dp, zero, gb, printed)


def test_zero_baseline_and_stage_formulas():
    psi, nd = 1.5e9, 8
    assert sum(model_state_bytes(psi, nd, 0)) == 16 * psi  # GPT-2 1.5B: "at least 24 GB"
    assert sum(model_state_bytes(psi, nd, 0)) / 1e9 == pytest.approx(24.0)
    assert sum(model_state_bytes(psi, nd, 1)) == pytest.approx(4 * psi + 12 * psi / nd)
    assert sum(model_state_bytes(psi, nd, 2)) == pytest.approx(2 * psi + 14 * psi / nd)
    assert sum(model_state_bytes(psi, nd, 3)) == pytest.approx(16 * psi / nd)


# Korthikanti et al. (2022) Table 2, bytes per layer, written out independently of analytics.py.
@pytest.mark.parametrize("s,b,h,a,t", [(2048, 1, 12288, 96, 8), (2048, 1, 20480, 128, 8), (2048, 4, 6144, 64, 8),
                                       (4096, 2, 4096, 32, 1)])
def test_korthikanti_table2_exactly(s, b, h, a, t):
    f = analytics.korthikanti_activation_bytes_per_layer
    sbh = s * b * h
    assert f(s, b, h, a, tp=1) == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    assert f(s, b, h, a, tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert f(s, b, h, a, tp=t, sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert f(s, b, h, a, tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)
    assert f(s, b, h, a, tp=t, sequence_parallel=True, recompute="selective") == pytest.approx(sbh * 34 / t, rel=1e-12)
    assert f(s, b, h, a, tp=t, recompute="full") == pytest.approx(2 * sbh, rel=1e-12)


def test_selective_recompute_saves_70_and_65_percent():
    # Korthikanti §5: 5as/h = 80 for GPT-3 and 64 for MT-NLG; selective recompute saves 70% and 65%.
    f = analytics.korthikanti_activation_bytes_per_layer
    for (h, a), saving in (((12288, 96), 0.70), ((20480, 128), 0.65)):
        full = f(2048, 1, h, a, tp=8, sequence_parallel=True)
        sel = f(2048, 1, h, a, tp=8, sequence_parallel=True, recompute="selective")
        assert 1 - sel / full == pytest.approx(saving, abs=0.005)


def _gpt(h, a, layers):
    return ModelConfig(vocab_size=51200, dim=h, n_layers=layers, n_heads=a, n_kv_heads=a, ffn_hidden=4 * h,
                       mlp="gelu", max_seq_len=2048)


def test_pipeline_inflight_eq5_eq6_and_interleaving():
    # 530B (MT-NLG): t=8, p=35, m=280. First stage holds L layers' worth under 1F1B (Eq. 6 with
    # selective recompute), times 1 + (p-1)/(p v) interleaved.
    cfg = _gpt(20480, 128, 105)
    wl = Workload(cfg, 2048, 280, attention="unfused")
    cl = Cluster(get_gpu("a100"), 280, 8)
    sbh = 2048 * 1 * 20480
    lay = Layout(dp_shard=1, tp=8, pp=35, zero=0, activation_checkpoint="selective", sequence_parallel=True)
    assert memory(wl, lay, cl).activations == pytest.approx(34 * sbh * 105 / 8, rel=1e-12)
    inter = Layout(dp_shard=1, tp=8, pp=35, zero=0, activation_checkpoint="selective", sequence_parallel=True,
                   pp_schedule="interleaved-1f1b", pp_virtual_stages=3)
    assert memory(wl, inter, cl).activations == pytest.approx(34 * sbh * 105 / 8 * (1 + 34 / (35 * 3)), rel=1e-12)
    # Eq. 5: no recompute, the S×S term included.
    lay = Layout(dp_shard=1, tp=8, pp=35, zero=0, activation_checkpoint="none", sequence_parallel=True)
    expected = sbh * 105 / 8 * (34 + 5 * 128 * 2048 / 20480)
    assert memory(wl, lay, cl).activations == pytest.approx(expected, rel=1e-12)


def test_inflight_counts():
    assert inflight_layer_microbatches(32, 1, 1, "1f1b", 8) == (32, 32)
    assert inflight_layer_microbatches(32, 4, 1, "1f1b", 16) == (32, 8)
    assert inflight_layer_microbatches(32, 4, 1, "1f1b", 2) == (16, 8)  # fewer micro-batches than stages
    assert inflight_layer_microbatches(32, 4, 1, "gpipe", 16) == (128, 128)


def test_more_sharding_and_recompute_never_use_more_memory():
    wl = Workload(PRESETS["llama3-8b"], 4096, 256)
    cl = Cluster(get_gpu("h100"), 64, 8)
    totals = [memory(wl, Layout(dp_shard=8, tp=8, zero=z, sequence_parallel=True), cl).total for z in range(4)]
    assert totals == sorted(totals, reverse=True)
    totals = [memory(wl, Layout(dp_shard=8, tp=8, zero=1, activation_checkpoint=r, sequence_parallel=True), cl).total
              for r in ("none", "selective", "full")]
    assert totals == sorted(totals, reverse=True)


def test_moe_experts_are_split_by_ep():
    wl = Workload(PRESETS["mixtral-8x7b"], 4096, 256)
    cl = Cluster(get_gpu("h100"), 64, 8)
    one = memory(wl, Layout(dp_shard=64, ep=1, zero=0), cl)
    eight = memory(wl, Layout(dp_shard=64, ep=8, zero=0), cl)
    expert = analytics.param_counts(PRESETS["mixtral-8x7b"]).expert
    assert one.params - eight.params == pytest.approx(2 * expert * (1 - 1 / 8), rel=1e-9)


def test_kv_heads_past_tp_are_replicated_weights_and_one_head_of_compute():
    """Llama 3 70B (8 kv heads) at tp=16: every rank keeps all of wk and wv (2 bytes each in bf16,
    over 80 layers), which tp=8 splits; each computes one kv head, not half of one."""
    from shoal.layout_rules import problems

    cfg, wl, cl = PRESETS["llama3-70b"], Workload(PRESETS["llama3-70b"], 8192, 512), Cluster(get_gpu("h100"), 256, 8)
    kv = 2 * cfg.dim * cfg.n_kv_heads * cfg.head_size
    sixteen = memory(wl, Layout(dp_shard=16, tp=16, zero=0), cl)
    eight = memory(wl, Layout(dp_shard=32, tp=8, zero=0), cl)
    split = (analytics.attention_params(cfg) - kv + analytics.mlp_params(cfg, cfg.ffn_hidden)) * cfg.n_layers
    split += 2 * cfg.vocab_size * cfg.dim  # the embedding and the head
    assert eight.params - sixteen.params == pytest.approx(2 * (split / 16 - kv * cfg.n_layers * (1 - 1 / 8)), rel=1e-6)
    assert analytics.kv_heads_per_rank(cfg, 16) == 1 and analytics.kv_heads_per_rank(cfg, 4) == 2
    assert not problems(Layout(dp_shard=16, tp=16), cfg, 256, 512, 8192)
    found = problems(Layout(dp_shard=1, tp=12), cfg.replace(n_heads=48, note=""), 12, 12, 8192)  # 12: not 8's multiple
    assert any(p.field == "parallel.tp" and "multiple of it; try [1, 2, 4, 8]" in str(p) for p in found), found


@pytest.mark.parametrize("zero", [0, 2])
def test_slow_link_state_is_optimizer_memory(zero):
    """Error feedback: one fp32 residual of the gradient a rank reduces (sharded under ZeRO-2);
    DiLoCo: an fp32 outer copy and momentum of the rank's parameters. Nothing else moves."""
    cfg = PRESETS["llama3-8b"]
    cl, lay = Cluster(get_gpu("h100"), 64, 8), Layout(dp_shard=8, tp=8, zero=zero, sequence_parallel=True)
    psi = analytics.param_counts(cfg).total / 8  # the rank's share under tp=8, embedding and head included
    plain = memory(Workload(cfg, 4096, 256), lay, cl)
    for fields, extra in (({"grad_compression": "topk"}, 4 * psi / (8 if zero else 1)),
                          ({"grad_compression": "powersgd"}, 4 * psi / (8 if zero else 1)),
                          ({"grad_compression": "int8"}, 0), ({"diloco_inner_steps": 50}, 8 * psi)):
        other = memory(Workload(cfg, 4096, 256, **fields), lay, cl)
        assert other.optimizer - plain.optimizer == pytest.approx(extra, rel=0.01), fields
        assert other.total - other.optimizer - other.overhead == pytest.approx(plain.total - plain.optimizer - plain.overhead)


def test_search_respects_memory_and_pins():
    wl = Workload(PRESETS["llama3-70b"], 4096, 512)
    cl = Cluster(get_gpu("h100"), 256, 8)
    result = search(wl, cl, Fixed(pp=4))
    assert result.plans and result.rejected["memory"] > 0
    for plan in result.plans:
        assert plan.memory.total <= get_gpu("h100").hbm_bytes
        assert plan.layout.pp == 4 and plan.layout.world == 256
    assert [p.tokens_per_s for p in result.plans] == sorted((p.tokens_per_s for p in result.plans), reverse=True)
    for miss in result.closest_misses:
        assert not miss.fits and miss.reasons[0].startswith("needs ")
        assert f"> {get_gpu('h100').hbm_bytes / GiB:.0f} GiB" in miss.reasons[0]


def test_the_loss_keeps_what_its_kernel_keeps_per_logit():
    cfg = PRESETS["llama3-8b"]
    per_logit = {loss: loss_bytes_per_logit(Workload(cfg, 8192, 8, loss=loss), 2) for loss in ("fp32", "te", "megatron")}
    # fp32 logits and their gradient; TE writes the gradient over the bf16 logits; Megatron's fp32 exp + a bf16 cast
    assert per_logit == {"fp32": 8, "te": 2, "megatron": 6}
    assert loss_bytes_per_logit(Workload(cfg, 8192, 8, kernels="eager", loss="te"), 2) == 14  # eager ignores it


def test_bf16_adam_moments_take_four_bytes_off_each_parameter():
    # DeepSeek-V3 §3.3.3; Megatron-Core's precision-aware optimizer with exp_avg_dtype = exp_avg_sq_dtype = bf16
    assert model_state_bytes(1e9, 8, 1, "bf16", "bf16") == (2e9, 2e9, 8e9 / 8)
    assert model_state_bytes(1e9, 8, 1, "fp32", "bf16") == (4e9, 4e9, 4e9 / 8)


def test_a_pipeline_stage_under_fsdp_holds_its_weights_and_gradients_whole():
    """torch.distributed.pipelining reduces a stage's gradients once, after its last micro-batch, and FSDP2
    keeps them unsharded in fp32 until then, with the stage's weights still gathered: zero 2/3 under a
    pipeline shards only the optimizer state (memory.stage_unsharded)."""
    wl = Workload(PRESETS["llama3-8b"], 4096, 256)
    cl = Cluster(get_gpu("h100"), 64, 8)
    zero1 = memory(wl, Layout(dp_shard=8, pp=8, zero=1), cl)
    for zero in (2, 3):
        m = memory(wl, Layout(dp_shard=8, pp=8, zero=zero), cl)
        assert (m.params, m.grads, m.optimizer) == (zero1.params, 2 * zero1.grads, zero1.optimizer)


def test_shoal_train_gathers_fp32_weights_unless_bf16_params():
    """FSDP2 with no param_dtype gathers shoal train's fp32 weights (train.precision bf16, fp8, fp16); bf16-params
    gathers bf16, as torchtitan: the memory check plans what the run gathers and holds."""
    from shoal.config import load_config
    from shoal.job import resolve

    def of(precision):
        return Workload.of_job(resolve(load_config(None, ["model.preset=tiny", f"train.precision={precision}"]), 1))

    assert (of("bf16").weight_gather, of("bf16-params").weight_gather) == ("fp32", "bf16")
    wl = Workload(PRESETS["llama3-8b"], 4096, 64)
    cl, lay = Cluster(get_gpu("h100"), 8, 8), Layout(dp_shard=8, zero=3)
    fp32 = memory(dataclasses.replace(wl, weight_gather="fp32"), lay, cl)
    layer = stage_params(PRESETS["llama3-8b"], lay, "only").layer
    # the gathered layer and the one prefetched, 2 bytes more per weight each
    assert fp32.buffers - memory(wl, lay, cl).buffers == pytest.approx(2 * 2 * layer)


def test_the_loss_is_freed_before_the_last_layer_is_recomputed():
    # Under full recompute the head's backward frees the loss's tensors before the last layer runs again, so
    # the peak holds the larger of the two, not both (eager as XLA).
    from shoal.planner.memory import layer_activation_bytes

    cfg, h100 = PRESETS["llama3-8b"], get_gpu("h100")
    wl, cl = Workload(cfg, 8192, 64), Cluster(h100, 8, 8)
    full, selective = (Layout(dp_shard=8, zero=3, micro_batch=1, activation_checkpoint=ac) for ac in ("full", "selective"))
    loss, embedding = 8192 * cfg.vocab_size * loss_bytes_per_logit(wl, 2), 8192 * cfg.dim * 2
    working = layer_activation_bytes(wl, full, "none")[0]
    assert memory(wl, selective, cl).logits == pytest.approx(loss + embedding)
    assert memory(wl, full, cl).logits == pytest.approx(embedding + loss - min(loss, working))
