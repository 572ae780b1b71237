"""TPUs run a training step as one XLA program (catalog.GPU.xla_step), which holds memory and recomputes
differently from eager PyTorch: the peak is the larger of two points of the program, not their sum; FSDP
gathers one layer and reduces its gradients in bf16; `selective` is JAX's dots policy (no attention output
kept); `full` recompute skips the MLP's down-projection. GPUs are unchanged. In-process and fast."""

import dataclasses

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model import analytics
from shoal.model.config import PRESETS, ModelConfig
from shoal.planner.compute import gemm_time, layer_time
from shoal.planner.evaluate import evaluate
from shoal.planner.memory import activation_bytes_per_layer, memory, model_state_bytes, rank_params
from shoal.planner.workload import Cluster, Workload

GiB = 2**30
V5E, V5P, H100 = (hardware.get_gpu(n) for n in ("tpu-v5e", "tpu-v5p", "h100"))
# MaxText's 32B at global_parameter_scale=32 (base.yml since 2024-02: llama2 block, SwiGLU, vocab 32000)
MX32 = ModelConfig(vocab_size=32000, dim=8192, n_layers=32, n_heads=64, n_kv_heads=64, head_dim=128,
                   ffn_hidden=28672, mlp="swiglu", max_seq_len=2048).validate()
EAGER = dataclasses.replace(V5E, name="v5e-as-eager", xla_step=0)  # the same chip planned as eager PyTorch


def test_tpus_and_only_tpus_run_one_xla_program():
    assert all(hardware.get_gpu(n).xla_step for n in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"))
    assert not any(hardware.get_gpu(n).xla_step for n in ("a100", "h100", "h200", "b200", "mi300x"))


def test_selective_on_xla_keeps_no_attention_output():
    wl, lay = Workload(MX32, 2048, 448), Layout(dp_shard=16, tp=4, zero=3, micro_batch=28,
                                                activation_checkpoint="selective", sequence_parallel=True)
    kept = activation_bytes_per_layer(wl, lay) - activation_bytes_per_layer(wl, lay, xla=True)
    assert kept == 28 * 2048 * MX32.n_heads * MX32.head_size / 4 * 2  # the attention output, bf16, over tp
    full = dataclasses.replace(lay, activation_checkpoint="full")  # the layer input either way
    assert activation_bytes_per_layer(wl, full) == activation_bytes_per_layer(wl, full, xla=True)
    # Without recompute XLA makes the element-wise outputs again rather than hold them: the two norms'
    # outputs (sequence-parallel, over tp) and SwiGLU's product (over tp), bf16
    none = dataclasses.replace(lay, activation_checkpoint="none")
    dropped = activation_bytes_per_layer(wl, none) - activation_bytes_per_layer(wl, none, xla=True)
    assert dropped == 28 * 2048 * (2 * MX32.dim + MX32.ffn_hidden) / 4 * 2


def test_xla_peak_is_the_larger_of_the_head_and_the_layer_backward():
    # MaxText v5e 32B: FSDP over 256 chips, 4 sequences a chip, full remat.
    wl, lay = Workload(MX32, 2048, 1024), Layout(dp_shard=256, zero=3, micro_batch=4, activation_checkpoint="full")
    xla, eager = memory(wl, lay, Cluster(V5E, 256, 256)), memory(wl, lay, Cluster(EAGER, 256, 256))
    layer = rank_params(MX32, 1, 1, 1, 1, "last").layer_dense
    assert xla.buffers == pytest.approx(layer * (2 + 2))  # one gathered bf16 layer and its bf16 gradients
    assert eager.buffers == pytest.approx(layer * (2 + 2 + 4))  # + the prefetched layer; fp32 gradients
    assert xla.logits == 0.0 < eager.logits  # the loss's tensors are freed before the layers' backward
    # every checkpoint, plus the layer being recomputed, less what XLA makes again of it: the norms' outputs and
    # SwiGLU's product
    assert eager.activations - xla.activations == 4 * 2048 * (2 * MX32.dim + MX32.ffn_hidden) * 2
    dynamic = xla.activations + xla.buffers  # buffers laid out at compile time: XLA's 0.4%, not the allocator's 5%
    assert xla.overhead == pytest.approx(V5E.reserved_bytes + 0.004 * dynamic)
    assert xla.fits and not eager.fits and xla.total < 13 * GiB


def test_xla_peak_at_the_head_when_the_loss_outweighs_a_layer():
    # selective, no recompute working set: with Llama 3's vocabulary the loss's logits outweigh one layer's
    # gathered weights and the gathered sequence at tp 4
    big = dataclasses.replace(MX32, vocab_size=128256)
    wl, lay = Workload(big, 2048, 448), Layout(dp_shard=16, tp=4, zero=3, micro_batch=28,
                                               activation_checkpoint="selective", sequence_parallel=True)
    m = memory(wl, lay, Cluster(V5P, 64, V5P.gpus_per_node))
    logits = 28 * 2048 * big.vocab_size / 4 * 4  # the fp32 logits; their gradient is made inside its readers
    assert m.logits == pytest.approx(logits)
    assert m.buffers == pytest.approx(2 * big.vocab_size * big.dim / 4 * 2)  # the head, gathered, and its gradient
    states = sum(model_state_bytes(rank_params(big, 4, 1, 1, 1, "last").dense, 16, 3))
    assert m.total == pytest.approx(states + m.activations + logits + m.buffers + m.overhead)


def test_maxtext_trillium_runs_fit_as_they_ran():
    # MaxText's tiering table (bench Source 20): FSDP over 256 v6e (31.25 GiB usable). Llama 3.1 70B at 5
    # sequences of 8,192 a chip holds 5.3e9 logits: fp32 logits and an fp32 gradient (39 GiB) would not fit,
    # the logits alone do. Llama 2 70B at 4 x 4,096 with full remat fits once the recomputed layer's
    # element-wise outputs are not held.
    v6e = hardware.get_gpu("tpu-v6e")
    l31 = Workload(PRESETS["llama3-70b"], 8192, 1280)
    offloaded = Layout(dp_shard=256, zero=3, micro_batch=5, activation_checkpoint="full", activation_offload=True)
    m = memory(l31, offloaded, Cluster(v6e, 256, v6e.gpus_per_node))
    assert m.logits == pytest.approx(5 * 8192 * 128256 * 4) and m.fits
    l2 = Workload(PRESETS["llama2-70b"], 4096, 1024)
    assert memory(l2, Layout(dp_shard=256, zero=3, micro_batch=4, activation_checkpoint="full"),
                  Cluster(v6e, 256, v6e.gpus_per_node)).fits


def test_gpus_are_planned_as_before():
    wl, lay = Workload(MX32, 2048, 1024), Layout(dp_shard=256, zero=3, micro_batch=4, activation_checkpoint="full")
    m = memory(wl, lay, Cluster(H100, 256, 8))
    assert m.logits > 0 and m.buffers == pytest.approx(rank_params(MX32, 1, 1, 1, 1, "last").layer_dense * 8)
    k = layer_time(MX32, H100, 2048, 4, 1, False, "flash", "bf16", False, 1)
    assert k.full_fwd == k.fwd and k.selective_fwd < k.attn_fwd + k.selective_fwd


def test_xla_full_recompute_skips_the_mlp_down_projection():
    k = layer_time(MX32, V5E, 2048, 4, 1, False, "flash", "bf16", False, 1)
    assert k.full_fwd == pytest.approx(k.fwd - gemm_time(4 * 2048, MX32.ffn_hidden, MX32.dim, V5E, "bf16"))
    eager = layer_time(MX32, EAGER, 2048, 4, 1, False, "flash", "bf16", False, 1)
    assert k.selective_fwd == pytest.approx(eager.selective_fwd + eager.attn_fwd)  # the attention forward reruns
    full = analytics.recompute_flops_per_token(MX32, 2048, "full")
    assert analytics.recompute_flops_per_token(MX32, 2048, "full", xla=True) == full - 2 * 32 * 8192 * 28672


def test_palm_hardware_flops_as_published():
    # PaLM 540B (Chowdhery et al. 2022, Table 3): 46.2% MFU, 57.8% HFU with rematerialisation, on TPU v4 in
    # JAX. A full recompute of the forward would put HFU/MFU at 1.33; JAX's, which skips what no backward
    # reads, at the published 1.25.
    palm = ModelConfig(vocab_size=256000, dim=18432, n_layers=118, n_heads=48, n_kv_heads=1, head_dim=256,
                       ffn_hidden=73728, mlp="swiglu", max_seq_len=2048).validate()
    lay = Layout(dp_shard=512, tp=12, zero=3, micro_batch=4, activation_checkpoint="full", sequence_parallel=True)
    v4 = dataclasses.replace(hardware.get_gpu("tpu-v4"), gpus_per_node=3072)
    plan = evaluate(Workload(palm, 2048, 2048), lay, Cluster(v4, 6144, 3072))
    assert plan.hfu / plan.mfu == pytest.approx(57.8 / 46.2, rel=0.03)
