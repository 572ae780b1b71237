"""The stack settings of DeepSpeed's pipeline engine and Megatron-LM of 2021 (Workload.pp_p2p and
Workload.grad_accumulation): each changes the step by what its mechanism costs, and nothing without it."""

import dataclasses

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.planner.memory import stage_params
from shoal.planner.timing import step_time
from shoal.planner.workload import Cluster, Workload

A100 = hardware.get_gpu("a100")
L8 = PRESETS["llama3-8b"]
# 8 GPUs a stage (tp 8 on one node), so every stage boundary crosses the network
PIPELINE = Layout(dp_shard=1, tp=8, pp=4, zero=1, micro_batch=1, activation_checkpoint="full")


def _steps(cfg, lay, field, values, batch=64):
    wl = Workload(cfg, 2048, batch)
    cl = Cluster(A100, lay.dp * lay.tp * lay.pp, 8)
    return [step_time(dataclasses.replace(wl, **{field: v}), lay, cl) for v in values]


def test_blocking_exchange_of_a_middle_stage_sets_the_pace_when_the_head_is_light():
    # A tiny vocabulary: the last stage's head hides nothing, and a middle stage's four blocking transfers and
    # three TP re-gathers per micro-batch are more than twice the two transfers a batched exchange puts there.
    batched, blocking = _steps(L8.replace(vocab_size=512), PIPELINE, "pp_p2p", ("batched", "blocking"))
    assert blocking.pp_comm > 2 * batched.pp_comm
    assert blocking.step > batched.step
    assert blocking.compute == batched.compute


def test_the_head_stage_hides_the_middle_stages_extra_transfers():
    # Llama 3's 128K vocabulary makes the last stage the slowest: it only receives the activation and sends its
    # gradient back, so blocking adds the metadata, the clone and its one re-gather to its two transfers.
    batched, blocking = _steps(L8, PIPELINE, "pp_p2p", ("batched", "blocking"))
    assert batched.pp_comm < blocking.pp_comm < 2 * batched.pp_comm


def test_without_a_pipeline_the_exchange_setting_changes_nothing():
    lay = Layout(dp_shard=8, tp=1, pp=1, zero=1, micro_batch=1)
    batched, blocking = _steps(L8, lay, "pp_p2p", ("batched", "blocking"))
    assert blocking.step == batched.step


def test_separate_accumulation_is_a_pass_over_the_gpus_gradients_per_microbatch():
    fused, separate = _steps(L8, PIPELINE, "grad_accumulation", ("fused", "separate"))
    m = fused.microbatches
    p = stage_params(L8, PIPELINE, "last")
    passes = (m - 1) * 3 * 2 * (p.dense + p.expert) / (A100.hbm_bandwidth * A100.hbm_efficiency)
    assert separate.compute - fused.compute == pytest.approx(passes)
    assert separate.step > fused.step + passes  # in every micro-batch's backward, so in the bubble's too


def test_fsdp_accumulates_its_fp32_shard_or_under_a_pipeline_the_whole_stage_in_fp32():
    # shoal train's ZeRO-2/3 reduce-scatter every micro-batch and add the fp32 shard; pipelined, FSDP2 holds the
    # stage's gradients unsharded in fp32 (memory.stage_unsharded)
    def added(lay):
        fused, separate = _steps(L8, lay, "grad_accumulation", ("fused", "separate"))
        return separate.compute - fused.compute

    zero1, zero3 = (Layout(dp_shard=8, tp=1, pp=1, zero=z, micro_batch=1) for z in (1, 3))
    assert added(zero3) == pytest.approx(added(zero1) * 2 / 8)  # 4 bytes instead of 2, one eighth of them
    piped1, piped3 = (dataclasses.replace(PIPELINE, dp_shard=2, zero=z) for z in (1, 3))
    assert added(piped3) == pytest.approx(added(piped1) * 2)


def test_one_microbatch_accumulates_nothing():
    fused, separate = _steps(L8, Layout(dp_shard=8, tp=1, pp=1, zero=1, micro_batch=1), "grad_accumulation",
                             ("fused", "separate"), batch=8)
    assert fused.microbatches == 1 and separate.step == fused.step
