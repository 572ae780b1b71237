"""Collectives, hardware catalog, cost and failures, scaling, recipes: the planner's smaller parts."""

import dataclasses
import json
import math
import tomllib

import pytest

from shoal.errors import UserError
from shoal.model.config import PRESETS
from shoal.planner import collectives as coll
from shoal import hardware
from shoal.hardware.gpu import FP8_MATMUL_RATIO
from shoal.planner import cost, scaling
from shoal.planner.evaluate import evaluate
from shoal.layout import Layout
from shoal.planner.workload import Cluster, Workload
from shoal.planner.recipe import recipe_text
from shoal.planner.search import Fixed

NET = coll.Network(intra_busbw=100e9, intra_latency=0.0, inter_busbw=10e9, inter_latency=0.0)


def test_collectives_follow_nccl_tests_busbw():
    S = 1e9
    # Inside one node: time = S * factor / busbw, factors 2(n-1)/n and (n-1)/n.
    assert coll.all_reduce(S, 8, 8, NET) == pytest.approx(S * 2 * 7 / 8 / 100e9)
    assert coll.all_gather(S, 8, 8, NET) == pytest.approx(S * 7 / 8 / 100e9)
    assert coll.reduce_scatter(S, 8, 8, NET) == pytest.approx(S * 7 / 8 / 100e9)
    assert coll.all_to_all(S, 8, 8, NET) == pytest.approx(S * 7 / 8 / 100e9)
    # One rank per node: the whole ring runs on the NICs.
    assert coll.all_reduce(S, 16, 1, NET) == pytest.approx(S * 2 * 15 / 16 / 10e9)
    # Across nodes NCCL's ring is one pipeline over all 128 ranks at its slowest hop's bus bandwidth: each of a
    # node's 8 GPUs leaves it on its own NIC for 1/8 of the channels, so the network side carries 8 x 10 GB/s.
    assert coll.all_reduce(S, 128, 8, NET) == pytest.approx(S * 2 * 127 / 128 / 80e9)
    assert coll.all_gather(S, 128, 8, NET) == pytest.approx(S * 127 / 128 / 80e9)
    fast_nics = dataclasses.replace(NET, inter_busbw=50e9)  # 8 x 50 GB/s outruns NVLink: NVLink sets the pace
    assert coll.all_gather(S, 128, 8, fast_nics) == pytest.approx(S * 127 / 128 / 100e9)
    assert coll.all_reduce(S, 1, 1, NET) == 0.0


def test_latency_terms():
    net = coll.Network(intra_busbw=1e30, intra_latency=1e-6, inter_busbw=1e30, inter_latency=1e-5)
    assert coll.all_reduce(8, 8, 8, net) == pytest.approx(2 * 7 * 1e-6)  # ring steps inside a node
    # across 1024 nodes NCCL's tree (10 steps up and down, each a chunk's latency) beats the ring's 2·1023
    assert coll.all_reduce(8, 1024, 1, net) == pytest.approx(2 * 10 * coll.TREE_STEP_INTER * 1e-5)
    assert coll.all_gather(8, 1024, 1, net) == pytest.approx(1023 * 1e-5)  # ring only for all_gather
    # a ring's latency grows with the ranks, not the nodes: 64 nodes of 8 pay 448 NVLink steps too
    assert coll.all_gather(8, 512, 8, net) == pytest.approx(63 * 1e-5 + 448 * 1e-6)


def test_groups_wider_than_a_leaf_share_the_spine():
    tiered = coll.Network(intra_busbw=100e9, intra_latency=0.0, inter_busbw=10e9, inter_latency=1e-5,
                          nodes_per_leaf=32, oversubscription=4)
    S = 1e9
    inside = coll.all_gather(S, 32 * 8, 8, tiered)  # 32 nodes: one leaf, full bandwidth
    assert inside == pytest.approx(coll.all_gather(S, 32 * 8, 8, NET) + 31 * 1e-5)
    wide = coll.all_gather(S, 64 * 8, 8, tiered)  # 64 nodes: through the 4:1 spine, two more hops per step
    assert wide == pytest.approx(S * 511 / 512 / (8 * 10e9 / 4) + 63 * 1.5e-5)
    assert coll.all_reduce(S, 64 * 8, 8, tiered) > 2 * coll.all_reduce(S, 64 * 8, 8, NET)  # NVLink part unchanged


def test_lookup_gpu_from_cuda_names():
    assert hardware.lookup_gpu("NVIDIA H100 80GB HBM3").peak_bf16_flops == 989e12
    assert hardware.lookup_gpu("NVIDIA A100-SXM4-80GB").peak_bf16_flops == 312e12
    assert hardware.lookup_gpu("NVIDIA H200").name == "h200"
    assert hardware.lookup_gpu("NVIDIA B200").name == "b200"
    assert hardware.lookup_gpu("NVIDIA H100 PCIe").peak_bf16_flops == 756e12  # its own entry, not the SXM's
    assert hardware.lookup_gpu("NVIDIA H100 NVL").name == "h100-nvl"
    assert hardware.lookup_gpu("Tesla V100-SXM2-16GB").hbm_bytes == 16 * 2**30
    assert hardware.lookup_gpu("NVIDIA GeForce RTX 4090") is None
    assert hardware.lookup_gpu("Tesla V100-SXM2-32GB").name == "v100"
    assert hardware.lookup_gpu("Tesla V100-PCIE-32GB") is None  # 112, not 125 TFLOP/s
    assert hardware.lookup_gpu("AMD Instinct MI250X").peak_bf16_flops == 191.5e12  # one GCD, as torch sees it
    # --gpu takes the same names, and those with spaces, underscores and form factors (40 GB stays 40 GB)
    for name, key in (("NVIDIA H100 80GB HBM3", "h100-sxm"), ("h100-sxm5", "h100-sxm"), ("H100_SXM", "h100-sxm"),
                      ("A100-SXM4-40GB", "a100-40gb"), ("a100-sxm4-80gb", "a100-80gb"), ("TPU v5e", "tpu-v5e"),
                      ("DGX-GB200", "gb200"), ("NVIDIA A800-SXM4-80GB", "a800"), ("NVIDIA H800", "h800"),
                      ("TPU v3", "tpu-v3"), ("NVIDIA H20", "h20"), ("NVIDIA L40S", "l40s"), ("Gaudi 3", "gaudi3"),
                      ("AMD Instinct MI355X", "mi355x"), ("Ironwood", "tpu-v7"), ("TPU7x", "tpu-v7")):
        assert hardware.get_gpu(name).name == key


def test_catalog_and_overrides(tmp_path):
    for name in hardware.known_names()[:-1]:  # every entry but the measured `local`
        gpu = hardware.get_gpu(name)
        assert gpu.peak_bf16_flops > 0 and 0 < gpu.matmul_efficiency <= 1 and gpu.hbm_bytes > 0
    assert hardware.get_gpu("v100").peak_flops("fp32") == 15.7e12  # Volta has no TF32: not half the fp16 peak
    with pytest.raises(UserError) as e:
        hardware.get_gpu("h1000")
    assert e.value.field == "gpu" and "h100" in e.value.fix
    slow = hardware.apply_overrides(hardware.get_gpu("h100"), hardware.parse_hw_flags(["inter_node_bandwidth=12.5e9"]))
    assert slow.inter_node_bandwidth == 12.5e9 and slow.peak_bf16_flops == 989e12
    with pytest.raises(UserError):
        hardware.apply_overrides(slow, {"matmul_efficiency": "1.5"})
    path = tmp_path / "cluster.toml"
    path.write_text('base = "a100"\ngpus_per_node = 4\ninter_node_bandwidth = 12.5e9\n')
    gpu = hardware.load_hw_file(path, None)
    assert (gpu.gpus_per_node, gpu.inter_node_bandwidth, gpu.peak_bf16_flops) == (4, 12.5e9, 312e12)


FAKE_PROFILE = {"cpu_count": 4, "memory_bytes": 16 * 2**30, "matmul_fp32_flops": 50e9, "matmul_bf16_flops": 5e9,
                "copy_bandwidth": 20e9, "gloo_busbw": 2e9, "gloo_latency": 50e-6, "host": "test"}


def test_local_profile_is_read_from_cache_not_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    (tmp_path / "local_profile.json").write_text(json.dumps(FAKE_PROFILE))
    gpu = hardware.get_gpu("local")
    assert (gpu.name, gpu.gpus_per_node, gpu.peak_fp32_flops, gpu.intra_node_bandwidth) == ("local", 4, 50e9, 2e9)
    assert gpu.hbm_bytes == 4 * 2**30
    wl = Workload(PRESETS["tiny"], 256, 16, precision="fp32")
    plan = evaluate(wl, Layout(dp_shard=2, zero=1), Cluster(gpu, 2, 4))
    assert plan.fits and plan.time.step > 0


def test_time_to_train_and_failures():
    est = cost.estimate(1e12, 1e6, 1000, usd_per_gpu_hour=2.0, mtbf_gpu_hours=1e9, checkpoint_interval_hours=1,
                        restart_hours=0, checkpoint_write_hours=0)
    assert est.ideal_hours == pytest.approx(1e12 / 1e6 / 3600)
    assert est.ideal_cost == pytest.approx(est.ideal_hours * 1000 * 2.0)
    assert est.expected_hours == pytest.approx(est.ideal_hours, rel=1e-5)  # failures practically never
    # A failure every 10 h, losing half of a 1 h interval plus a 0.5 h restart: 10% of the time lost.
    est = cost.estimate(3.6e9 * 100, 1e6, 100, mtbf_gpu_hours=1000, checkpoint_interval_hours=1, restart_hours=0.5)
    assert est.job_mtbf_hours == 10
    assert est.expected_hours == pytest.approx(100 / 0.9)
    assert est.lost_hours == pytest.approx(est.expected_hours - 100)
    assert est.goodput == pytest.approx(0.9)
    never = cost.estimate(1e12, 1e6, 100000, mtbf_gpu_hours=50000, checkpoint_interval_hours=2)
    assert math.isinf(never.expected_hours) and never.as_dict()["expected_hours"] is None
    # An absurd --tokens reads as years and exponents, not twenty digits of days
    from shoal.planner.render import duration, human, training_lines
    assert (duration(10 * 86400), duration(1e24), human(8.53e22, "$")) == ("10.0 days", "3.17e+16 years", "8.53e+22$")
    assert all(len(line) < 250 for line in training_lines(cost.estimate(1e30, 6e5, 64, usd_per_gpu_hour=3.0)))


def test_scaling_sweep_finds_the_wall():
    wl = Workload(PRESETS["llama3-8b"], 4096, 64)
    cl = Cluster(hardware.get_gpu("h100"), 8, 8)
    points = scaling.sweep(wl, cl, scaling.gpu_counts(8, 512), Fixed(), base_gpus=8)
    fixed_global = [p for p in points if p.mode == "fixed-global-batch"]
    assert [p.n_gpus for p in fixed_global] == [8, 16, 32, 64, 128, 256, 512]
    eff = scaling.efficiency(fixed_global)
    assert max(eff.values()) == pytest.approx(1.0)
    assert eff[512] < eff[8]  # a 64-sequence batch cannot keep 512 GPUs busy
    diminishing, _ = scaling.knee(fixed_global)
    assert diminishing is not None
    weak = [p for p in points if p.mode == "fixed-per-gpu-batch"]
    assert [p.global_batch for p in weak] == [64 * n // 8 for n in (8, 16, 32, 64, 128, 256, 512)]
    assert scaling.parse_scale("8:16384") == (8, 16384)
    with pytest.raises(UserError):
        scaling.parse_scale("16384:8")
    assert scaling.parse_scale(f"1:{scaling.MAX_SPAN}") == (1, scaling.MAX_SPAN)
    with pytest.raises(UserError, match=r"25 GPU counts.* try --scale 1:16384 or 611:10000000"):
        scaling.parse_scale("1:10000000")  # a sweep of 50 searches: 90 s


def test_recipe_uses_trainer_sections():
    wl = Workload(PRESETS["llama3-8b"], 4096, 64)
    cl = Cluster(hardware.get_gpu("h100"), 16, 8)
    plan = evaluate(wl, Layout(dp_shard=2, tp=4, pp=2, zero=0, micro_batch=2, activation_checkpoint="selective",
                               pp_schedule="interleaved-1f1b", pp_virtual_stages=2, sequence_parallel=True), cl)
    doc = tomllib.loads(recipe_text(plan, preset="llama3-8b", tokens=1e9))
    assert doc["model"] == {"preset": "llama3-8b"}
    assert doc["parallel"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 4, "cp": 1, "pp": 2, "ep": 1, "expert_tp": 0, "zero": 0,
                               "pp_schedule": "interleaved-1f1b", "pp_microbatches": 0, "pp_virtual_stages": 2,
                               "sequence_parallel": True, "grad_compression": "none", "diloco_inner_steps": 0,
                               "rank_order": "tp-dp-pp", "offload": "none"}
    assert doc["train"] == {"micro_batch": 2, "global_batch": 64, "seq_len": 4096, "activation_checkpoint": "selective",
                            "activation_offload": False, "precision": "bf16", "steps": 3815,
                            "compile": True}  # planned with fused kernels
    # A model given by its shape: the trainer lays [model] over its default preset, `tiny`, so the
    # recipe must rebuild exactly the planned model from it (and allow the planned sequence length).
    moe = PRESETS["debug-moe"]
    wl = Workload(moe, 512, 8)
    custom = tomllib.loads(recipe_text(evaluate(wl, Layout(dp_shard=2, ep=2, zero=2),
                                                Cluster(hardware.get_gpu("h100"), 2, 8))))
    assert "preset" not in custom["model"] and custom["parallel"]["dp_shard"] == 2
    assert {"dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "mlp", "n_experts", "top_k",
            "expert_ffn_hidden", "n_shared_experts"} <= set(custom["model"])
    assert PRESETS["tiny"].replace(**custom["model"]) == moe.replace(max_seq_len=512)
    # What shoal train cannot run is not emitted.
    with pytest.raises(UserError) as e:
        recipe_text(evaluate(wl, Layout(dp_shard=2, ep=2, zero=1), Cluster(hardware.get_gpu("h100"), 2, 8)))
    assert e.value.field == "parallel.zero"


def test_search_keeps_to_what_the_trainer_runs():
    from shoal.planner.search import search

    h100 = hardware.get_gpu("h100")
    result = search(Workload(PRESETS["mixtral-8x7b"], 4096, 256), Cluster(h100, 64, 8))
    assert result.plans and not result.note and result.rejected["trainer"] > 0
    assert all(p.trainer_limit is None for p in result.plans)
    # GPT-3's tied embeddings and 50,257-token vocabulary leave shoal train nothing on 1024 GPUs:
    # the planner still plans (for another trainer) and says so.
    gpt3 = search(Workload(PRESETS["gpt3-175b"], 2048, 1536), Cluster(hardware.get_gpu("a100"), 1024, 8))
    assert gpt3.plans and gpt3.note
    assert all(any(r.startswith("shoal train cannot run") for r in p.reasons) for p in gpt3.plans)


def test_power_cap_slows_kernels_and_sets_the_energy():
    h100 = hardware.get_gpu("h100")
    capped = hardware.apply_overrides(h100, {"power_limit_watts": 400})
    assert capped.sustained_scale == pytest.approx(835 / 989, rel=0.01)  # the H100 NVL/SXM datasheet pair
    assert capped.board_watts == 400 and h100.board_watts == 700 and h100.sustained_scale == 1.0
    wl = Workload(PRESETS["llama3-8b"], 4096, 64)
    lay = Layout(dp_shard=8, zero=1, micro_batch=1)
    fast, slow = evaluate(wl, lay, Cluster(h100, 8, 8)), evaluate(wl, lay, Cluster(capped, 8, 8))
    assert 1.1 < slow.time.step / fast.time.step < 1 / capped.sustained_scale + 0.01


def test_fp8_speeds_up_the_gemms_only_and_keeps_the_bf16_mfu_denominator():
    h100 = hardware.get_gpu("h100")
    wl16, wl8 = (Workload(PRESETS["llama3-70b"], 8192, 64, precision=p) for p in ("bf16", "fp8"))
    lay = Layout(dp_shard=8, tp=8, zero=1, micro_batch=1)
    bf16, fp8 = evaluate(wl16, lay, Cluster(h100, 64, 8)), evaluate(wl8, lay, Cluster(h100, 64, 8))
    speedup = bf16.time.step / fp8.time.step
    assert 1.1 < speedup < 2 * FP8_MATMUL_RATIO  # attention, norms and comms stay 16-bit
    assert fp8.mfu / bf16.mfu == pytest.approx(speedup)  # both against the BF16 peak
    # same weights and optimizer state; the GEMMs keep their FP8 inputs for backward (Transformer Engine)
    assert (fp8.memory.params, fp8.memory.optimizer) == (bf16.memory.params, bf16.memory.optimizer)
    assert 0.7 * bf16.memory.activations < fp8.memory.activations < bf16.memory.activations
    # torchao's Float8Linear (shoal train's recipe) keeps the 16-bit input and casts it again in backward
    torchao = evaluate(dataclasses.replace(wl8, fp8_saves="input"), lay, Cluster(h100, 64, 8))
    assert torchao.memory.activations == bf16.memory.activations


def test_an_unpublished_interleaving_factor_is_searched_when_the_rest_is_pinned():
    from shoal.planner.search import evaluate_pinned
    wl = Workload(PRESETS["llama3-70b"], 4096, 64)
    lay = Layout(dp_shard=2, tp=8, pp=8, zero=1, micro_batch=1, pp_schedule="interleaved-1f1b",
                 activation_checkpoint="full")
    cluster = Cluster(hardware.get_gpu("h100"), 128, 8)
    given, free = evaluate_pinned(wl, lay, cluster), evaluate_pinned(wl, lay, cluster, interleave_given=False)
    assert given.layout.virtual_stages == 2 and free.layout.virtual_stages > 2  # 32 micro-batches, 10 layers a rank
    assert free.time.bubble < given.time.bubble and free.tokens_per_s > given.tokens_per_s


def test_selective_op_recomputes_every_second_gemm_and_keeps_less():
    """torchtitan's per-op checkpointing: selective's element-wise work plus wk, wo and w3 forward."""
    from shoal.planner.compute import gemm_time, layer_time

    h100, cfg = hardware.get_gpu("h100"), PRESETS["llama3-8b"]
    wl = Workload(cfg, 8192, 64)
    plans = {ac: evaluate(wl, Layout(dp_shard=8, zero=3, micro_batch=1, activation_checkpoint=ac), Cluster(h100, 8, 8))
             for ac in ("selective", "selective-op", "full")}
    layer = layer_time(cfg, h100, 8192, 1, 1, False, "flash", "bf16", False, 1)
    q, kv, T = cfg.n_heads * cfg.head_size, cfg.n_kv_heads * cfg.head_size, 8192.0
    every_second = sum(gemm_time(T, k, n, h100, "bf16")
                       for k, n in ((cfg.dim, kv), (q, cfg.dim), (cfg.dim, cfg.ffn_hidden)))
    assert layer.op_fwd == pytest.approx(layer.selective_fwd + every_second)
    recompute = {ac: p.time.recompute for ac, p in plans.items()}
    assert recompute["selective"] < recompute["selective-op"] < recompute["full"]
    activations = {ac: p.memory.activations for ac, p in plans.items()}
    assert activations["full"] < activations["selective-op"] < activations["selective"]
    assert plans["selective"].hfu < plans["selective-op"].hfu and plans["selective"].mfu > plans["selective-op"].mfu


@pytest.mark.parametrize("gpu,n,per_node,nodes", [
    ("gb200", 72, 72, 1),     # one NVL72 rack
    ("gb200", 128, 64, 2),    # power-of-two jobs fill 64 of each rack's 72
    ("h100", 12, 6, 2),       # launchers start as many ranks on every node
    ("h100", 16, 8, 2),
])
def test_ranks_fill_nodes_evenly(gpu, n, per_node, nodes):
    cluster = Cluster(hardware.get_gpu(gpu), n, hardware.get_gpu(gpu).gpus_per_node)
    assert (cluster.gpus_per_node, cluster.n_nodes) == (per_node, nodes)


def test_a_pipeline_stage_under_fsdp_gathers_and_reduces_once_per_step():
    """torch.distributed.pipelining keeps a stage gathered from its first forward and reduce-scatters once after its
    last backward (torchtitan and shoal train do not re-shard after forward under a pipeline), so its data-parallel
    traffic does not grow with the micro-batches; without a pipeline ZeRO-3 gathers twice and reduces each one."""
    cluster = Cluster(hardware.get_gpu("h100"), 64, 8)

    def traffic(pp, batch):
        lay = Layout(dp_shard=64 // pp, pp=pp, zero=3, pp_schedule="1f1b" if pp > 1 else "gpipe")
        return evaluate(Workload(PRESETS["llama3-8b"], 4096, batch), lay, cluster).time.dp_comm_total

    assert traffic(8, 64) == pytest.approx(traffic(8, 128))
    assert traffic(1, 128) == pytest.approx(2 * traffic(1, 64))
