"""The planner's MoE layer on fine-grained experts (issue 31, second pass): the expert all-to-all inside
a node is on the critical path (the published recipes do not overlap it there), and moving tokens to
their experts and back costs the passes shoal's and Megatron's dispatchers make. In-process and fast."""

import dataclasses

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.planner import compute
from shoal.planner.compute import layer_time
from shoal.planner.timing import step_time
from shoal.planner.workload import Cluster, Workload

B200 = hardware.get_gpu("b200")
DSV3 = PRESETS["deepseek-v3"]


def _per_microbatch_ep(lay: Layout, global_batch: int, gpus: int) -> float:
    t = step_time(Workload(DSV3, 4096, global_batch, precision="fp8"), lay, Cluster(B200, gpus, 8))
    return t.ep_comm / t.microbatches


def test_expert_exchange_inside_a_node_is_not_hidden():
    # Megatron-Bridge's B200 DeepSeek-V3 / Qwen3-235B presets: EP 8 in one node, moe_a2a_overlap=False.
    lay = Layout(dp_shard=16, pp=16, ep=8, zero=1, micro_batch=1, pp_schedule="1f1b")
    many = _per_microbatch_ep(lay, 2048, 256)  # 128 micro-batches in flight
    one = _per_microbatch_ep(lay, 16, 256)  # m = 1: nothing to hide behind
    assert many == pytest.approx(one)
    # Across nodes (EP 64 over the network, DualPipe / Megatron's EP overlap) it still hides.
    wide = Layout(dp_shard=128, pp=2, ep=64, zero=1, micro_batch=1, pp_schedule="1f1b")
    assert _per_microbatch_ep(wide, 2048, 256) < _per_microbatch_ep(wide, 128, 256)


def test_token_permutation_passes_grow_with_expert_parallelism():
    # a host that issues ops for free, so that the layer's kernels, not the host's wait, are compared
    quick_host = dataclasses.replace(B200, host_op_cost=1e-15, host_gemm_cost=1e-15)
    args = (DSV3, quick_host, 4096, 1, 1, False, "flash", "bf16", True)
    local, spread = layer_time(*args, 1), layer_time(*args, 8)
    # ep > 1 re-sorts the arrived tokens by expert and back: MOE_EP_SORT_ELEMS more element passes over
    # every (token, expert) copy, forward (gaps and GEMMs differ too: compare only the elementwise share).
    extra = compute.MOE_EP_SORT_ELEMS * 4096 * DSV3.top_k * DSV3.dim * 2 / (B200.hbm_bandwidth * B200.hbm_efficiency)
    gemm_and_gaps = (spread.gemm_fwd - local.gemm_fwd) + (2 * DSV3.n_experts / 8 - 2 * DSV3.n_experts) * B200.kernel_gap
    assert spread.fwd - local.fwd == pytest.approx(extra + gemm_and_gaps, rel=1e-6)
    dense = dataclasses.replace(DSV3, n_experts=0, top_k=0, expert_ffn_hidden=0, n_shared_experts=0,
                                n_dense_layers=0)
    assert layer_time(dense, B200, 4096, 1, 1, False, "flash", "bf16", False, 1).fwd < local.fwd
