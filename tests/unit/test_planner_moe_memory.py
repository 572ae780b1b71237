"""What an MoE layer keeps for backward: shoal's own layer, measured, and Megatron-Core's, which weighs each
expert's output inside its activation and so keeps no expert outputs for the combine (Workload.moe_probs)."""

import dataclasses

import pytest
import torch

from shoal.config import load_config
from shoal.job import resolve
from shoal.model import analytics
from shoal.model.config import PRESETS, ModelConfig
from shoal.model.transformer import Transformer
from shoal.planner.workload import Workload
from shoal.train.memory import ActivationMeter

DENSE = PRESETS["tiny"]
B, T = 2, 128


def _saved_bytes(cfg) -> int:
    torch.manual_seed(0)
    model = Transformer(cfg)
    with ActivationMeter(list(model.parameters())) as meter:
        model(torch.randint(0, cfg.vocab_size, (B, T)))
    return meter.peak


def _planned_layers(cfg, moe_probs: str, fused: bool = False) -> float:
    return sum(analytics.activation_bytes_per_layer(cfg, T, B, layer=i, bytes_per_element=4, fused=fused,
                                                    moe_probs=moe_probs) for i in range(cfg.n_layers))


@pytest.mark.parametrize("shared", [0, 1])
def test_shoal_moe_layer_is_counted_as_measured(shared):
    moe = dataclasses.replace(DENSE, n_experts=8, top_k=2, expert_ffn_hidden=256, n_shared_experts=shared).validate()
    measured = _saved_bytes(moe) - _saved_bytes(DENSE)  # the same embedding and head: the layers' difference
    planned = _planned_layers(moe, "output") - _planned_layers(DENSE, "output")
    # Left out: the router's softmax output and the routing indices, about 1% here. Without index_add_'s
    # saved source (2 x top_k x h per token, not 1) the plan was 2.06 MB below the 5.27 MB measured.
    assert planned == pytest.approx(measured, rel=0.02)


def test_weighing_inside_the_activation_keeps_no_expert_outputs():
    moe = dataclasses.replace(DENSE, n_experts=8, top_k=2, expert_ffn_hidden=256).validate()
    tokens_x_layers = B * T * moe.n_layers
    fused = _planned_layers(moe, "output", fused=True) - _planned_layers(moe, "activation", fused=True)
    assert fused == pytest.approx(tokens_x_layers * (moe.top_k * moe.dim - 2 * moe.top_k) * 4)
    eager = _planned_layers(moe, "output") - _planned_layers(moe, "output", fused=True)
    assert eager > tokens_x_layers * moe.top_k * moe.dim * 4  # index_add_'s source, and eager's norms and SwiGLU


def test_shoal_train_is_checked_as_its_moe_layer_runs():
    job = resolve(load_config(None, ["model.preset=tiny-moe"]), 1)
    assert Workload.of_job(job).moe_probs == "output"
    assert Workload(job.model, 128, 8).moe_probs == "activation"  # the GPU default: Megatron-Core's layer


def test_megatron_core_qwen3_235b_layer_term_by_term():
    # Megatron-Core + Transformer Engine, FP8, no recompute (the Megatron-Bridge preset), per token, in bytes.
    cfg = ModelConfig(vocab_size=151936, dim=4096, n_layers=94, n_heads=64, n_kv_heads=4, head_dim=128,
                                qk_norm=True, ffn_hidden=12288, n_experts=128, top_k=8, expert_ffn_hidden=1536,
                                max_seq_len=4096).validate()
    h, q, kv, out, f, k = 4096, 8192, 512, 8192, 1536, 8
    attention = (2 * h + h  # the norm's input; its output as the QKV GEMM's FP8 cast (LayerNormLinear)
                 + 2 * (q + 2 * kv)  # q, k, v (rotated) the attention kernel keeps
                 + 2 * (q + kv)  # the q and k norms' inputs
                 + 2 * out + out)  # the attention output: the kernel's 16-bit copy and the output GEMM's FP8 cast
    moe = (2 * h + 2 * h  # the norm's input and output, which the router keeps in 16 bits
           + k * h  # each copy's FP8 expert input (GroupedLinear fc1)
           + 2 * k * 2 * f  # fc1's output, which the weighted SwiGLU keeps
           + k * f  # fc2's FP8 input
           + 4 * cfg.n_experts + 4 * k)  # fp32 router logits; the routing weights the SwiGLU keeps
    planned = analytics.activation_bytes_per_layer(cfg, 4096, 1, layer=0, fused=True, gemm_input_bytes=1,
                                                   moe_probs="activation") / 4096
    assert planned == attention + moe  # 183.8 KB; 263.7 KB before the combine and q/k norms were Megatron's
