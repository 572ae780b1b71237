"""The stack settings that decide what the collectives carry (Workload.grad_reduce, fp8_gather, pp_overlap): each
changes only the traffic it names, and only where the stack would run it. In-process, no torch."""

import dataclasses

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.planner.timing import step_time
from shoal.planner.workload import Cluster, Workload

H100 = hardware.get_gpu("h100")
L70 = PRESETS["llama3-70b"]


def _step(layout: Layout, gpus: int, **settings):
    wl = Workload(L70, 4096, 128, precision=settings.pop("precision", "fp8"), **settings)
    return step_time(wl, layout, Cluster(H100, gpus, 8))


def test_bf16_gradients_halve_the_reduction_not_the_gather():
    # Megatron-Bridge's grad_reduce_in_fp32 = False: the reduce-scatter moves 2 bytes a gradient, the gather stays
    lay = Layout(dp_shard=16, tp=8, zero=1, micro_batch=1, sequence_parallel=True)
    fp32, bf16 = _step(lay, 128, precision="bf16"), _step(lay, 128, precision="bf16", grad_reduce="bf16")
    # fp16 mixed precision reduces fp16 gradients (Megatron forces fp32 for bf16 only); shoal train reduces fp32
    assert _step(lay, 128, precision="fp16").dp_comm_total == pytest.approx(bf16.dp_comm_total)
    assert _step(lay, 128, precision="fp16", grad_reduce="fp32").dp_comm_total == pytest.approx(fp32.dp_comm_total)
    # fp32: reduction 2 units + gather 1 unit; bf16: 1 + 1 (latency aside)
    assert bf16.dp_comm_total == pytest.approx(fp32.dp_comm_total * 2 / 3, rel=0.05)
    assert bf16.tp_comm == fp32.tp_comm


def test_fp8_activation_gathers_cut_sequence_parallel_traffic_by_a_quarter():
    # Transformer Engine gathers the FP8 cast in front of the column-parallel GEMMs; reduce-scatters stay 16-bit
    lay = Layout(dp_shard=16, tp=8, zero=1, micro_batch=1, sequence_parallel=True)
    plain, fp8 = _step(lay, 128, fp8_gather="none"), _step(lay, 128, fp8_gather="activations")
    assert 0.74 * plain.tp_comm < fp8.tp_comm < 0.85 * plain.tp_comm  # half the bytes of half the collectives
    assert fp8.dp_comm_total == plain.dp_comm_total  # weights still gathered in bf16
    bf16 = Layout(dp_shard=16, tp=8, zero=1, micro_batch=1, sequence_parallel=True)
    assert _step(bf16, 128, precision="bf16", fp8_gather="activations").tp_comm == _step(
        bf16, 128, precision="bf16").tp_comm  # nothing is FP8 under bf16


def test_fp8_weights_halve_the_zero3_gathers():
    # Megatron-Core's fp8_param_gather: a ZeRO-3 layer gathers one byte a weight, its gradients stay as they were
    lay = Layout(dp_shard=64, tp=1, zero=3, micro_batch=1)
    act, every = _step(lay, 64, fp8_gather="activations"), _step(lay, 64, fp8_gather="all")
    # per layer and micro-batch: 2 gathers (forward, backward) + 1 fp32 reduce-scatter = 2 x 2 + 4 bytes -> 2 x 1 + 4
    assert every.dp_comm_total == pytest.approx(act.dp_comm_total * 6 / 8, rel=0.05)


def test_pipeline_overlap_hides_interleaved_sends_only():
    inter = Layout(dp_shard=2, tp=8, pp=8, zero=1, micro_batch=1, sequence_parallel=True,
                   pp_schedule="interleaved-1f1b", pp_virtual_stages=5)
    waited, hidden = _step(inter, 128), _step(inter, 128, pp_overlap=True)
    assert hidden.pp_comm < 0.5 * waited.pp_comm and hidden.step < waited.step
    plain = dataclasses.replace(inter, pp_schedule="1f1b", pp_virtual_stages=1)
    assert _step(plain, 128, pp_overlap=True).pp_comm == _step(plain, 128).pp_comm  # Megatron: interleaved only
    zb = dataclasses.replace(inter, pp_schedule="zero-bubble")  # not Megatron's schedule: nothing overlapped
    assert _step(zb, 128, pp_overlap=True).pp_comm == _step(zb, 128).pp_comm


def test_shoal_gathers_in_16_bits_where_both_fp8_libraries_cast_first():
    from shoal.planner.stacks import STACKS

    wl = Workload(L70, 4096, 128)
    assert (wl.grad_reduce, wl.fp8_gather, wl.pp_overlap) == ("auto", "activations", False)
    assert STACKS["shoal"]["fp8_gather"] == "none"  # torchao's Float8Linear under plain ColwiseParallel


def test_the_flags_reach_the_plans_workload(capsys):
    import json

    from shoal.cli.main import main

    args = ["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--gpu", "h100", "--gpus",
            "16", "--precision", "fp8", "--tp", "2", "--pp", "2", "--dp", "4", "--top", "1", "--json"]
    assert main(args + ["--grad-reduce", "bf16", "--fp8-gather", "all", "--pp-overlap", "on"]) == 0
    workload = json.loads(capsys.readouterr().out)["workload"]
    assert (workload["grad_reduce"], workload["fp8_gather"], workload["pp_overlap"]) == ("bf16", "all", True)


def test_fp8_gathers_without_fp8_are_named_as_ignored():
    import argparse

    from shoal.planner.request import ignored_flags

    args = argparse.Namespace(precision="bf16", fp8_gather="all")
    assert any("--fp8-gather=all has no effect" in line for line in ignored_flags(args))
    assert not ignored_flags(argparse.Namespace(precision="fp8", fp8_gather="all"))


def test_offload_copies_beside_the_next_layer_cost_less_than_waiting_for_them():
    # Transformer Engine's CPU offload copies on its own stream; save_on_cpu (shoal train) on the compute stream
    from shoal.planner.stacks import STACKS

    offloaded = Layout(dp_shard=16, tp=8, zero=1, micro_batch=8, sequence_parallel=True, activation_offload=True)
    beside, waiting = _step(offloaded, 128, offload_overlap=True), _step(offloaded, 128, offload_overlap=False)
    assert 0 < beside.offload < waiting.offload and beside.step < waiting.step
    # Transformer Engine's count (Megatron's cpu_offloading_num_layers): the fewest layers that fit go out, none
    # where everything fits; save_on_cpu sends every layer
    fits = dataclasses.replace(offloaded, micro_batch=1)
    assert _step(fits, 128, offload_overlap=True).offload == 0 < _step(fits, 128, offload_overlap=False).offload
    kept = dataclasses.replace(offloaded, activation_offload=False)
    assert _step(kept, 128, offload_overlap=True).step == _step(kept, 128, offload_overlap=False).step
    assert STACKS["shoal"]["offload_overlap"] is False
