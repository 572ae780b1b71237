"""The time model against published training runs (shared/reference/calibration.md and the papers).

Tolerances are per source, not per row: Korthikanti's layer timings and iteration times are
measurements of one configuration each (10%); Narayanan's Table 1 is end-to-end throughput of runs
whose micro-batch and interleaving were not published, so the planner searches them (15%); Llama 3
ran its own schedule and memory tricks (20%).
"""

import pytest

from shoal.model import analytics
from shoal.model.config import PRESETS, ModelConfig
from shoal.planner import collectives as coll
from shoal.planner.compute import layer_time
from shoal.planner.evaluate import evaluate
from shoal.hardware.lookup import get_gpu
from shoal.layout import Layout
from shoal.planner.workload import Cluster, Workload
from shoal.planner.search import Fixed, search
from shoal.planner.timing import network

A100 = get_gpu("a100")
H100 = get_gpu("h100")


def gpt(h, a, layers):
    """Megatron's GPT: 4h GeLU MLP, multi-head attention, vocabulary 51,200."""
    return ModelConfig(vocab_size=51200, dim=h, n_layers=layers, n_heads=a, n_kv_heads=a, ffn_hidden=4 * h,
                       mlp="gelu", max_seq_len=2048)


# Narayanan et al. 2021, Table 1: (h, heads, layers, tp, pp, GPUs, global batch, TFLOP/s per GPU).
NARAYANAN = [
    (2304, 24, 24, 1, 1, 32, 512, 137), (3072, 32, 30, 2, 1, 64, 512, 138),
    (4096, 32, 36, 4, 1, 128, 512, 142), (6144, 48, 40, 8, 1, 256, 1024, 135),
    (8192, 64, 48, 8, 2, 512, 1536, 138), (10240, 80, 60, 8, 4, 1024, 1792, 140),
    (12288, 96, 80, 8, 8, 1536, 2304, 148), (16384, 128, 96, 8, 16, 1920, 2160, 155),
    (20480, 128, 105, 8, 35, 2520, 2520, 163), (25600, 160, 128, 8, 64, 3072, 3072, 163),
]


@pytest.mark.parametrize("h,a,l,tp,pp,n,B,published", NARAYANAN)
def test_narayanan_table1_throughput(h, a, l, tp, pp, n, B, published):
    # Megatron 2021: full recomputation, plain data parallelism, unfused attention; micro-batch and
    # interleaving unpublished, so searched. The paper's metric is Eq. (3) FLOPs / time / GPUs.
    wl = Workload(gpt(h, a, l), 2048, B, attention="unfused")
    best = search(wl, Cluster(A100, n, 8), Fixed(tp=tp, pp=pp, zero=0, activation_checkpoint="full",
                                                 sequence_parallel=False)).best
    predicted = analytics.megatron_flops_per_iteration(B, 2048, l, h, 51200) / best.time.step / n / 1e12
    assert predicted == pytest.approx(published, rel=0.15)


# Korthikanti et al. 2022, Table 4: one layer of the 22B model (s=2048, b=4, t=8), milliseconds.
def _layer_ms(sp: bool, recompute: str) -> tuple[float, float]:
    cfg = gpt(6144, 64, 48)
    kt = layer_time(cfg, A100, 2048, 4, 8, sp, "unfused", "bf16", False, 1)
    act = 2048 * 4 * 6144 * 2
    net = network(Cluster(A100, 8, 8))
    comm = 4 * coll.all_gather(act, 8, 8, net) if sp else 2 * coll.all_reduce(act, 8, 8, net)
    extra = {"none": 0.0, "selective": kt.attn_fwd, "full": kt.fwd + comm}[recompute]
    return 1e3 * (kt.fwd + comm), 1e3 * (kt.bwd + comm + extra)


@pytest.mark.parametrize("sp,recompute,fwd,bwd", [
    (False, "none", 7.7, 11.9), (True, "none", 7.2, 11.8), (False, "full", 7.7, 19.5),
    (False, "selective", 7.7, 13.2), (True, "selective", 7.2, 13.1)])
def test_korthikanti_table4_layer_times(sp, recompute, fwd, bwd):
    f, b = _layer_ms(sp, recompute)
    assert f == pytest.approx(fwd, rel=0.10)
    assert f + b == pytest.approx(fwd + bwd, rel=0.10)


def test_korthikanti_recompute_overheads():
    base = sum(_layer_ms(False, "none"))
    assert sum(_layer_ms(False, "full")) / base - 1 == pytest.approx(0.39, abs=0.05)
    assert sum(_layer_ms(False, "selective")) / base - 1 == pytest.approx(0.07, abs=0.04)


# Korthikanti et al. 2022, Table 5 (the paper; its MFU column reproduces with 312 TFLOP/s): end-to-end
# iteration seconds with full recompute and with selective recompute + sequence parallelism.
KORTHIKANTI_T5 = [
    # h, heads, layers, tp, pp, GPUs (DP = 1), global batch, micro-batch, v, s full recompute, s selective + SP
    (6144, 64, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    (12288, 96, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    (20480, 128, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    (25600, 160, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]


@pytest.mark.parametrize("h,a,l,tp,pp,n,B,mb,v,full,present", KORTHIKANTI_T5)
def test_korthikanti_table5_iteration_time(h, a, l, tp, pp, n, B, mb, v, full, present):
    wl = Workload(gpt(h, a, l), 2048, B, attention="unfused")
    cl = Cluster(A100, n, 8)
    sched = "interleaved-1f1b" if v > 1 else "1f1b"
    for recompute, sp, published in (("full", False, full), ("selective", True, present)):
        lay = Layout(dp_shard=1, tp=tp, pp=pp, zero=0, micro_batch=mb, pp_schedule=sched, pp_virtual_stages=v,
                     activation_checkpoint=recompute, sequence_parallel=sp)
        plan = evaluate(wl, lay, cl)
        assert plan.fits
        assert plan.time.step == pytest.approx(published, rel=0.10), recompute


@pytest.mark.parametrize("n,dp,published", [(8192, 64, 430), (16384, 128, 400)])
def test_llama3_405b_bf16(n, dp, published):
    # Llama 3 paper Table 4: TP 8, PP 16, seq 8192, 16M tokens per batch; BF16 model TFLOP/s per GPU.
    wl = Workload(PRESETS["llama3-405b"], 8192, 2048)
    best = search(wl, Cluster(H100, n, 8), Fixed(tp=8, pp=16, dp=dp, micro_batch=1)).best
    assert best.model_tflops_per_gpu == pytest.approx(published, rel=0.20)
    assert best.mfu == pytest.approx(best.model_tflops_per_gpu * 1e12 / 989e12)


def test_mfu_uses_design_convention():
    wl = Workload(PRESETS["llama3-8b"], 4096, 64)
    plan = evaluate(wl, Layout(dp_shard=8, tp=1, zero=1, micro_batch=1), Cluster(H100, 8, 8))
    flops = analytics.flops_per_token(PRESETS["llama3-8b"], 4096) * 4096 * 64
    assert plan.mfu == pytest.approx(flops / (plan.time.step * 8 * 989e12))
    assert plan.hfu == pytest.approx(plan.mfu)  # no recomputation: HFU equals MFU


def test_published_runs_name_each_source_once():
    """bench/published_runs.toml labelled two sources "Source 12" and two "Source 19", so "see Source 19" (there
    and in docs/planner.md) could mean either; every label is one source, and every one cited exists."""
    import re
    from collections import Counter
    from pathlib import Path

    root = Path(__file__).parents[2]
    runs = (root / "bench" / "published_runs.toml").read_text()
    labels = Counter(re.findall(r"^# Source (\d+[a-z]?):", runs, re.M))
    assert len(labels) > 20 and [k for k, n in labels.items() if n > 1] == []
    cited = {n for text in (runs, (root / "docs" / "planner.md").read_text())
             for m in re.finditer(r"\bSources? ((?:\d+[a-z]?(?:, | and )?)+)", text)
             for n in re.findall(r"\d+[a-z]?", m[1])}
    assert cited - set(labels) == set()
