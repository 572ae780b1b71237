"""The planner on the shapes of published runs (issue 31): the layouts that ran fit, the expert
all-to-all is deduplicated and overlapped, the data-parallel wall grows with ranks, head_dim and
context parallelism and offloading are planned. In-process and fast: physics, not a table."""

import dataclasses

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.layout_rules import problems
from shoal.model import analytics
from shoal.model.config import PRESETS
from shoal.planner import collectives as coll
from shoal.planner.evaluate import evaluate
from shoal.planner.memory import layer_activation_bytes, memory
from shoal.planner.pipeline import held_layer_microbatches, inflight_layer_microbatches, stage_layers
from shoal.planner.search import Fixed, evaluate_pinned, search
from shoal.planner.stacks import stack_settings
from shoal.planner.timing import ranks_per_token, step_time
from shoal.planner.workload import Cluster, Workload, expert_grid

H100 = hardware.get_gpu("h100")
L405 = PRESETS["llama3-405b"]


@pytest.mark.parametrize("dp", [64, 128])
def test_llama3_405b_published_layout_fits(dp):
    # Llama 3 §3.3.2: TP8 PP16 interleaved, DP 64/128, micro-batch 1, no recompute at 8K; V not published.
    lay = Layout(dp_shard=dp, tp=8, pp=16, zero=1, micro_batch=1, pp_schedule="interleaved-1f1b")
    plan = evaluate_pinned(Workload(L405, 8192, 2048), lay, Cluster(H100, dp * 128, 8), interleave_given=False)
    assert plan.fits, plan.memory.as_dict()
    assert 0.35 < plan.mfu < 0.50  # published: 43% and 41%


def test_edge_stages_take_the_missing_layers():
    assert stage_layers(126, 128)[:2] == (0, 1) and stage_layers(126, 128)[-1] == 0  # embedding / head alone
    assert stage_layers(126, 64)[0] == stage_layers(126, 64)[-1] == 1 and sum(stage_layers(126, 64)) == 126
    assert stage_layers(32, 8) == (4,) * 8


def test_interleaved_warmup_is_korthikantis_count_when_chunks_are_equal():
    L, p, v, m = 128, 8, 4, 64
    first, last = inflight_layer_microbatches(L, p, v, "interleaved-1f1b", m)
    assert first == pytest.approx(L * (1 + (p - 1) / (p * v)))  # Korthikanti §4.2.3
    assert last == pytest.approx(((v - 1) * p + 1) * L / (p * v))
    # A light first chunk is what rank 0 holds most of: 126 layers leave it lighter than 128 would
    assert inflight_layer_microbatches(126, p, v, "interleaved-1f1b", m)[0] < first


def test_fused_layers_save_fewer_tensors():
    wl = Workload(PRESETS["llama3-8b"], 4096, 64)
    lay, cl = Layout(dp_shard=8, zero=3, micro_batch=1), Cluster(H100, 8, 8)
    eager = memory(dataclasses.replace(wl, kernels="eager"), lay, cl).activations
    fused = memory(wl, lay, cl).activations
    assert 0.6 < fused / eager < 0.85  # 4h and 3f saved per token instead of 6h and 4f


def test_expert_all_to_all_sends_a_token_once_per_rank_and_hides():
    assert ranks_per_token(256, 8, 1) == 1.0
    assert ranks_per_token(256, 8, 64) == pytest.approx(7.68, abs=0.01)  # not 8
    assert ranks_per_token(256, 8, 256) == pytest.approx(8.0)
    # DeepEP crosses the network once per node (5.29 of EP 64's 8 nodes), forwarding inside it over NVLink
    net, token = coll.Network(160e9, 0.0, 40e9, 0.0), 1e6
    assert coll.all_to_all_via_nodes(token, 7.68, 5.27, 64, 8, net) == pytest.approx(token * 5.27 * 7 / 8 / 40e9)
    assert coll.all_to_all(token * 7.68, 64, 8, net) == pytest.approx(token * 7.68 * 56 / 64 / 40e9)  # per rank
    assert coll.all_to_all_via_nodes(token, 6.4, 1, 8, 8, net) == coll.all_to_all(token * 6.4, 8, 8, net)
    wl = Workload(PRESETS["deepseek-v3"], 4096, 8192)
    lay = Layout(dp_shard=128, pp=8, ep=64, zero=1, micro_batch=1, pp_schedule="1f1b")
    cl = Cluster(H100, 1024, 8)
    overlapped = step_time(wl, lay, cl)
    one = step_time(dataclasses.replace(wl, global_batch=128), dataclasses.replace(lay, pp=8), cl)  # m = 1
    assert overlapped.ep_comm / overlapped.microbatches < one.ep_comm / one.microbatches
    full = step_time(wl, dataclasses.replace(lay, activation_checkpoint="full"), cl)
    assert full.ep_comm == pytest.approx(overlapped.ep_comm)  # recompute does not exchange again


def test_the_expert_exchange_hides_where_ep_overlap_says():
    # Megatron-MoE ModelZoo's Qwen3-235B on 256 H100, EP 32 over four nodes, published without and with
    # --overlap-moe-expert-parallel-comm (19.7 s and 17.6 s): off charges the exchange whole, on hides it behind
    # another micro-batch's MoE layer, auto does what on does across nodes and what off does inside one
    wl = Workload(PRESETS["qwen3-235b-a22b"], 4096, 2048)
    across = Layout(dp_shard=16, tp=2, pp=8, ep=32, zero=1, micro_batch=1, sequence_parallel=True,
                    pp_schedule="interleaved-1f1b", pp_virtual_stages=4)
    cl = Cluster(H100, 256, 8)
    off, on, auto = (step_time(dataclasses.replace(wl, ep_overlap=o), across, cl) for o in ("off", "on", "auto"))
    assert on.ep_comm < 0.5 * off.ep_comm and on.step < off.step and auto.ep_comm == on.ep_comm
    inside = Layout(dp_shard=256, ep=8, zero=1, micro_batch=1)  # eight neighbours: one node
    wl = dataclasses.replace(wl, global_batch=1024)
    off, on, auto = (step_time(dataclasses.replace(wl, ep_overlap=o), inside, cl) for o in ("off", "on", "auto"))
    assert on.ep_comm < off.ep_comm and auto.ep_comm == off.ep_comm
    one = dataclasses.replace(wl, global_batch=128, ep_overlap="on")  # one micro-batch a rank: nothing to hide behind
    assert step_time(one, inside, cl).ep_comm == step_time(dataclasses.replace(one, ep_overlap="off"), inside, cl).ep_comm


def test_megatron_alltoall_dispatch_sends_a_16_bit_copy_per_expert():
    # Qwen3-30B-A3B on one B200 node, EP 8, FP8 (Megatron-Bridge 25.11): 128 experts top-8 on 8 ranks are 6.4
    # ranks per token deduplicated; Megatron's alltoall dispatcher sends all 8 copies, in bf16 both ways, and its
    # send/recv waits a hop per peer where DeepEP's kernels wait one. Megatron's flex dispatcher (DeepEP or
    # HybridEP) deduplicates but dispatches in bf16 too. Eight sequences a micro-batch: the bytes dominate.
    cfg = dataclasses.replace(PRESETS["deepseek-v3"], n_layers=4, n_dense_layers=0, n_experts=128, top_k=8,
                              expert_groups=0, expert_groups_per_token=0)
    lay, cl = Layout(dp_shard=8, ep=8, zero=1, micro_batch=8), Cluster(hardware.get_gpu("b200"), 8, 8)
    wl = Workload(cfg, 4096, 512, precision="fp8")
    dedup, per_expert, dedup_bf16 = (step_time(dataclasses.replace(wl, moe_dispatch=d), lay, cl).ep_comm
                                     for d in ("dedup", "per-expert", "dedup-bf16"))
    bytes_ratio = 8 * (2 + 2) / (ranks_per_token(128, 8, 8) * (1 + 2))
    assert bytes_ratio < per_expert / dedup == pytest.approx(bytes_ratio, rel=0.05)
    assert dedup_bf16 / dedup == pytest.approx((2 + 2) / (1 + 2), rel=0.01)


def test_the_data_parallel_wall_grows_with_ranks():
    net = coll.Network(450e9 * 0.8, 5e-6, 50e9 * 0.9, 10e-6)
    small = [coll.all_gather(64e6, n, 8, net) for n in (64, 512, 4096)]
    assert small[0] < small[1] < small[2]  # ring latency over all ranks
    wl = Workload(PRESETS["llama3-70b"], 4096, 0)
    per_gpu = []
    for n in (1024, 8192):
        lay = Layout(dp_shard=n // 32, tp=8, pp=4, zero=1, micro_batch=1, pp_schedule="1f1b")
        t = step_time(dataclasses.replace(wl, global_batch=n // 32 * 16), lay, Cluster(H100, n, 8))
        per_gpu.append(t.step)
    assert per_gpu[1] > per_gpu[0]  # same per-GPU batch, slower step at 8x the GPUs



def test_the_last_gradient_bucket_shows_whole():
    # Megatron-Core's buckets hold max(40M, 1M x dp) parameters: at dp 4096 an 8B model has 2 buckets for 32
    # layers, and the one the first layers fill cannot start before the backward ends.
    # (what hides is free here, ring_overlap_cost 0, so only the buckets' structure counts)
    wl, per_gpu, free = Workload(PRESETS["llama3-8b"], 8192, 0), {}, dataclasses.replace(H100, ring_overlap_cost=0.0)
    for n in (256, 4096):
        t = step_time(dataclasses.replace(wl, global_batch=n), Layout(dp_shard=n, zero=1, micro_batch=1),
                      Cluster(free, n, 8))
        per_gpu[n] = t
    assert per_gpu[4096].dp_comm_total == pytest.approx(per_gpu[256].dp_comm_total, rel=0.05)
    assert per_gpu[4096].dp_comm > 2 * per_gpu[256].dp_comm  # half the reduction exposed, not 1/32


def test_the_first_parameter_gather_bucket_shows_whole():
    # Megatron-Core's --overlap-param-gather waits for the first bucket's all-gather before the first layer: at dp
    # 4096 the 8B model's gather is 2 buckets, so half of it shows, as half of the reduce-scatter does.
    wl, lay, cl = Workload(PRESETS["llama3-8b"], 8192, 4096), Layout(dp_shard=4096, zero=1, micro_batch=1), Cluster(H100, 4096, 8)
    t = step_time(wl, lay, cl)
    assert t.dp_comm > 0.5 * t.dp_comm_total  # the reduce-scatter's half and the gather's half


def test_a_reduction_after_the_backward_shows_whole():
    # Megatron-LM until 2023 and DeepSpeed's pipeline engine reduce after the last backward and gather after the
    # optimizer step: all of it on the critical path, where the overlapped default hides most of it (what
    # hides still costs ring_overlap_cost of its time: 0.61 over NVLink, so about a third is saved).
    wl, lay, cl = Workload(PRESETS["llama3-8b"], 8192, 256), Layout(dp_shard=256, zero=1, micro_batch=1), Cluster(H100, 256, 8)
    hidden, after = (step_time(dataclasses.replace(wl, grad_overlap=o), lay, cl) for o in (True, False))
    assert after.dp_comm == pytest.approx(after.dp_comm_total) and after.dp_comm_total == hidden.dp_comm_total
    assert hidden.dp_comm < 0.7 * after.dp_comm
    assert after.step - hidden.step == pytest.approx(after.dp_comm - hidden.dp_comm)

def test_head_dim_and_replicated_kv_heads_are_planned():
    wide = PRESETS["llama3-8b"].replace(head_dim=256, n_kv_heads=1)  # 32 x 256 = 8192 != 4096
    base = PRESETS["llama3-8b"].replace(n_kv_heads=1)
    assert analytics.flops_per_token(wide, 4096) > analytics.flops_per_token(base, 4096)
    lay = Layout(dp_shard=1, tp=8, zero=0, micro_batch=1)  # tp 8 > 1 KV head: replicated
    assert not [p for p in problems(lay, wide, 8, 8, 4096) if p.field == "parallel.tp"]
    wl_w, wl_b = Workload(wide, 4096, 8), Workload(base, 4096, 8)
    cl = Cluster(H100, 8, 8)
    assert memory(wl_w, lay, cl).activations > memory(wl_b, lay, cl).activations
    assert step_time(wl_w, lay, cl).compute > step_time(wl_b, lay, cl).compute


def test_search_finds_the_interleaved_layout_it_plans_pinned():
    # 12 micro-batches per rank on pp=8: not a multiple, a trainer limit; the search falls back to it.
    wl, cl = Workload(PRESETS["llama3-70b"], 4096, 24), Cluster(H100, 64, 8)
    fixed = Fixed(dp=2, tp=4, pp=8, zero=1, micro_batch=1, activation_checkpoint="none",
                  pp_schedule="interleaved-1f1b", pp_virtual_stages=2)
    found = search(wl, cl, fixed)
    assert found.plans, found.rejected
    pinned = evaluate(wl, found.best.layout, cl)
    assert found.best.tokens_per_s == pytest.approx(pinned.tokens_per_s)


def test_context_parallel_splits_activations_and_hides_its_ring():
    wl, cl = Workload(PRESETS["llama3-70b"], 65536, 16), Cluster(H100, 64, 8)
    one = Layout(dp_shard=2, tp=8, pp=4, zero=1, micro_batch=1, pp_schedule="1f1b")
    two = dataclasses.replace(one, dp_shard=1, cp=2)
    m1, m2 = memory(wl, one, cl), memory(wl, two, cl)
    assert m2.activations == pytest.approx(m1.activations / 2, rel=0.01)
    assert m2.optimizer == pytest.approx(m1.optimizer)  # ZeRO shards over dp x cp alike
    t = step_time(wl, two, cl)
    assert 0 < t.cp_comm < 0.02 * t.step  # at 64K tokens the K/V ring hides behind attention
    assert two.world == 64 and two.rank_stride("cp") == 8 and two.rank_stride("dp") == 16


def test_offload_moves_state_to_the_host_and_costs_pcie_time():
    wl, cl = Workload(PRESETS["llama3-8b"], 4096, 64), Cluster(H100, 8, 8)
    lay = Layout(dp_shard=8, zero=1, micro_batch=1)
    off = dataclasses.replace(lay, offload="optimizer")
    on_gpu, host = memory(wl, lay, cl), memory(wl, off, cl)
    assert host.optimizer == 0 and host.host == pytest.approx(on_gpu.optimizer)
    assert step_time(wl, off, cl).offload > 0 and step_time(wl, lay, cl).offload == 0
    acts = memory(dataclasses.replace(wl, offload_overlap=False), dataclasses.replace(lay, activation_offload=True), cl)
    assert acts.activations < on_gpu.activations and acts.host > 0


@pytest.mark.parametrize("gpu, published", [("gb200", 40), ("gb300", 20)])
def test_transformer_engine_offloads_the_fewest_layers_that_fit(gpu, published):
    # Megatron-Bridge 25.11's Llama 3 70B on 64 GB200/GB300, FSDP, micro-batch 2 at 8K, no recompute: its recipes
    # offload 40 and 20 of the 80 layers (cpu_offloading_num_layers); the planner offloads what it must to fit.
    wl = Workload(PRESETS["llama3-70b"], 8192, 256, precision="fp8", **stack_settings("megatron-bridge", {}))
    lay = Layout(dp_shard=64, zero=3, micro_batch=2, activation_offload=True)
    mem = memory(wl, lay, Cluster(hardware.get_gpu(gpu), 64, 72))
    assert mem.fits and mem.offloaded_share * 80 == pytest.approx(published, abs=3)


def test_activation_offload_copies_wait_for_pcie_in_full():
    # save_on_cpu copies on the compute stream (offload_overlap off, shoal train): the step grows by every saved
    # byte out and back over PCIe, the layers' and the loss's fp32 log-probabilities alike.
    from shoal.planner.memory import activation_bytes_per_layer

    wl, cl = Workload(PRESETS["llama3-8b"], 4096, 8, offload_overlap=False), Cluster(H100, 8, 8)
    lay = Layout(dp_shard=8, zero=3, micro_batch=1)
    off = dataclasses.replace(lay, activation_offload=True)
    saved = activation_bytes_per_layer(wl, off) * wl.model.n_layers + 4096 * wl.model.vocab_size * 4
    copies = 2 * saved / H100.host_bandwidth
    assert step_time(wl, off, cl).offload == pytest.approx(copies, rel=1e-6)


@pytest.mark.parametrize("gpu, kernel, head_dim, low, high", [
    ("h100", "flash", 128, 0.49, 0.49), ("h100", "flash2", 128, 0.28, 0.28),
    ("h100", "flash", 64, 0.37, 0.40), ("h100", "flash2", 64, 0.23, 0.25),  # measured: 0.37 and 0.24
    ("a100", "flash2", 128, 0.55, 0.55), ("a100", "flash", 64, 0.45, 0.50),
])
def test_attention_rate_by_kernel_and_head_dim(gpu, kernel, head_dim, low, high):
    # The H200 measurements behind the catalog (docs/measurements/h200-kernels.json): cuDNN's kernel and
    # FlashAttention-2 at head dims 128 and 64; Ampere has one kernel, FlashAttention-2.
    from shoal.planner.compute import attention_rate

    device = hardware.get_gpu(gpu)
    share = attention_rate(device, kernel, head_dim, "bf16") / device.peak_flops("bf16")
    assert low - 1e-9 <= share <= high + 1e-9, share


@pytest.mark.parametrize("name", ["gb200-nvl72", "gb300", "tpu-v5e", "trillium", "mi325x"])
def test_newer_parts_plan_published_sizes(name):
    # Runs on these parts are published at power-of-two sizes (MaxText's v5e/v6e tables, NVL72 racks).
    gpu = hardware.get_gpu(name)
    best = search(Workload(PRESETS["llama3-8b"], 8192, 256), Cluster(gpu, 256, gpu.gpus_per_node)).best
    assert best is not None and best.fits and 0.2 < best.mfu < 0.8, (name, best and best.mfu)


def test_fp16_plans_as_bf16_reducing_16_bit_gradients():
    wl, cl, lay = Workload(PRESETS["llama3-8b"], 4096, 64), Cluster(H100, 8, 8), Layout(dp_shard=8, micro_batch=1)
    bf16 = evaluate(dataclasses.replace(wl, grad_reduce="bf16"), lay, cl)
    fp16 = evaluate(dataclasses.replace(wl, precision="fp16"), lay, cl)
    assert fp16.time.step == pytest.approx(bf16.time.step) and fp16.memory.total == pytest.approx(bf16.memory.total)


def test_xla_overlaps_tensor_parallel_collectives_on_tpus():
    tpu = hardware.get_gpu("tpu-v5p")
    wl, lay = Workload(PRESETS["llama3-70b"], 2048, 128), Layout(dp_shard=16, tp=8, zero=3, micro_batch=1)
    exposed = step_time(wl, lay, Cluster(dataclasses.replace(tpu, tp_overlap=0.0), 128, 64)).tp_comm
    assert step_time(wl, lay, Cluster(tpu, 128, 64)).tp_comm < 0.5 * exposed


def test_expert_groups_wider_than_data_parallel_fold_over_tp():
    # Megatron-Bridge's DeepSeek-V3 on 1,024 H100: TP2 PP16 EP64 with 32-way data parallelism (MoE parallel
    # folding): sound and planned (a trainer limit for shoal train), whole experts per rank.
    lay = Layout(dp_shard=32, tp=2, pp=16, ep=64, zero=1, micro_batch=1, pp_schedule="1f1b")
    wl, cl = Workload(PRESETS["deepseek-v3"], 4096, 8192), Cluster(H100, 1024, 8)
    found = problems(lay, wl.model, 1024, 8192, 4096)
    assert found and all(type(p).__name__ == "TrainerLimit" for p in found), found
    plan = evaluate(wl, lay, cl)
    assert plan.fits and plan.time.ep_comm > 0
    assert problems(dataclasses.replace(lay, ep=3), wl.model, 1024, 8192, 4096)  # 256 experts: still refused


def test_expert_tensor_parallelism_repartitions_the_expert_grid():
    # Megatron-Core's ModelZoo Qwen3-235B on 256 H100: TP 4, EP 8 inside 8-way data parallelism, ETP 1. Whole
    # experts per rank: four times the expert weights and gradients a rank holds at TP 4, their ZeRO-1 states
    # sharded over four times the ranks (the same bytes a rank); the same expert FLOPs in GEMMs of another shape.
    cfg = PRESETS["qwen3-235b-a22b"]
    wl, cl = Workload(cfg, 4096, 2048), Cluster(H100, 256, 8)
    lay = Layout(dp_shard=8, tp=4, pp=8, ep=8, zero=1, micro_batch=1, pp_schedule="interleaved-1f1b",
                 pp_virtual_stages=4, sequence_parallel=True)
    whole = dataclasses.replace(lay, expert_tp=1)
    assert (expert_grid(lay), expert_grid(whole)) == ((4, 1), (1, 4))
    assert expert_grid(dataclasses.replace(lay, expert_tp=4)) == expert_grid(lay)  # the layout's own split, named
    split, one = memory(wl, lay, cl), memory(wl, whole, cl)
    assert one.params > split.params and one.grads > split.grads and one.optimizer == split.optimizer
    assert evaluate(wl, whole, cl).fits and evaluate(wl, whole, cl).time.ep_comm > 0
    # sound, but not what shoal train runs; a split that does not tile the ranks or the experts is refused
    limits = [type(p).__name__ for p in problems(whole, cfg, 256, 2048, 4096) if "expert_tp" in p.field]
    assert limits == ["TrainerLimit"]
    for bad in (3, 8):  # 3 x 8 does not divide 32 ranks; 8 x 8 > 32
        found = [p for p in problems(dataclasses.replace(lay, expert_tp=bad), cfg, 256, 2048, 4096)
                 if "expert_tp" in p.field]
        assert found and type(found[0]).__name__ == "UserError", bad
    assert problems(dataclasses.replace(lay, expert_tp=2), PRESETS["llama3-8b"], 256, 2048, 4096)  # not MoE


def test_deepseek_v3_published_layout_fits_with_light_recompute():
    # DeepSeek-V3 §3.2-3.3: PP16 x EP64 on 2,048 H800, ZeRO-1, FP8 GEMMs (their inputs cached in FP8),
    # RMSNorm and element-wise work recomputed; 4K sequences, batch 15,360.
    lay = Layout(dp_shard=128, pp=16, ep=64, zero=1, micro_batch=1, pp_schedule="1f1b", activation_checkpoint="selective")
    wl = Workload(PRESETS["deepseek-v3"], 4096, 15360, precision="fp8")
    assert evaluate(wl, lay, Cluster(hardware.get_gpu("h800"), 2048, 8)).fits
    # Its DualPipe (§3.2.1): rank 0 holds stage 0, DeepSeek-V3's three dense layers, for p micro-batches and the
    # last stage's three MoE layers for one; each layer is counted as its own kind.
    dual = dataclasses.replace(lay, pp_schedule="dualpipe")
    assert held_layer_microbatches(wl.model, 16, 1, "dualpipe", 120) == ((48.0, 3.0), (48.0, 3.0))
    dense, moe = layer_activation_bytes(wl, dual)
    mem = memory(wl, dual, Cluster(hardware.get_gpu("h800"), 2048, 8))
    assert mem.fits and mem.activations == pytest.approx(48 * dense + 3 * moe)
