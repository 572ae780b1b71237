"""DeepSpeed's ZeRO-3 of spring 2021 (`--zero3-impl deepspeed-2021`, planner/deepspeed_zero3.py): a weight at a
time, one module ahead, the host in step with the device, fp16 gradient all-reduces. In-process and fast."""

import dataclasses
import json

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model.config import ModelConfig
from shoal.planner import collectives as coll
from shoal.planner import deepspeed_zero3 as ds
from shoal.planner.memory import memory
from shoal.planner.timing import network, step_time
from shoal.planner.workload import Cluster, Workload

A100 = hardware.get_gpu("a100")
# Narayanan et al. 2021's GPTs (Table 2): 175B (96 x 12288) and 530B (105 x 20480), V 51,200, s 2,048
GPT175 = ModelConfig(vocab_size=51200, dim=12288, n_layers=96, n_heads=96, n_kv_heads=96, ffn_hidden=49152,
                     mlp="gelu", max_seq_len=2048)
GPT530 = dataclasses.replace(GPT175, dim=20480, n_layers=105, n_heads=128, n_kv_heads=128, ffn_hidden=81920)


def plan(cfg, gpus, batch, micro, impl):
    wl = Workload(cfg, 2048, batch, attention="unfused", zero3_impl=impl)
    lay = Layout(dp_shard=gpus, zero=3, micro_batch=micro, activation_checkpoint="full")
    cl = Cluster(A100, gpus, 8)
    return step_time(wl, lay, cl), memory(wl, lay, cl)


def test_a_gpt_layer_is_four_modules_in_call_order():
    w = ds.module_weights(GPT175, 12 * 12288**2)
    assert w == pytest.approx((3 * 12288**2, 12288**2, 4 * 12288**2, 4 * 12288**2))


def test_strong_scaling_is_bound_by_the_per_weight_schedule_not_the_kernels():
    # At a fixed batch the kernels halve with the GPUs; DeepSpeed-2021's traffic does not hide behind them.
    fsdp, _ = plan(GPT175, 1536, 1536, 1, "fsdp")
    deepspeed, _ = plan(GPT175, 1536, 1536, 1, "deepspeed-2021")
    assert deepspeed.compute == fsdp.compute
    assert deepspeed.fsdp_comm > 3 * fsdp.fsdp_comm
    assert deepspeed.fsdp_comm > deepspeed.compute + deepspeed.recompute


def test_no_prefetch_past_max_live_parameters(monkeypatch):
    # A 530B GPT layer's weights are 0.4-1.7e9 elements: past stage3_max_live_parameters (1e9) the next weight is
    # gathered only when its module runs, with the device waiting.
    weights = ds.module_weights(GPT530, 12 * 20480**2)
    cl = Cluster(A100, 640, 8)
    args = (weights, 0.4, 0.4, 0.8, (0.01, 0.02), 640, 8, network(cl), A100, 2)
    waiting = ds.layer_cost(*args)
    monkeypatch.setattr(ds, "MAX_LIVE_PARAMETERS", 1e12)
    prefetching = ds.layer_cost(*args)
    assert waiting.fwd > prefetching.fwd + 0.5 * ds_gather(weights[2], cl)


def ds_gather(w, cl):
    return coll.all_gather(2 * w, cl.n_gpus, 8, network(cl))


def test_the_host_issues_one_op_per_rank_for_each_gather():
    # Small weights over many ranks: the per-rank views and copies (n x host_op_cost) outlast the wire they run
    # beside, and the device waits for the rest.
    weights = (2e5,) * 4
    cl = Cluster(A100, 2048, 8)
    args = (weights, 1e-4, 1e-4, 2e-4, (0.0, 0.0), 2048, 8, network(cl))
    busy = ds.layer_cost(*args, A100, 2)
    idle = ds.layer_cost(*args, dataclasses.replace(A100, host_op_cost=0.0), 2)
    wire = ds_gather(2e5, cl) + ds.GATHER_COPY_PASSES * 4e5 / (A100.hbm_bandwidth * A100.hbm_efficiency)
    assert 2048 * A100.host_op_cost > wire
    assert busy.fwd - idle.fwd == pytest.approx(4 * (2048 * A100.host_op_cost - wire), rel=0.05)


def test_small_weights_persist_and_gradients_are_all_reduced_in_fp16():
    weights = (5e4,) * 4  # under stage3_param_persistence_threshold: gathered once, never per pass
    cl = Cluster(A100, 64, 8)
    z = ds.layer_cost(weights, 0.0, 0.0, 0.0, (0.0, 0.0), 64, 8, network(cl), A100, 2)
    assert z.fwd == 0.0
    stream = A100.hbm_bandwidth * A100.hbm_efficiency
    reduce = sum(coll.all_reduce(2 * w, 64, 8, network(cl)) + ds.REDUCE_HBM_PASSES * 2 * w / stream for w in weights)
    assert z.traffic == pytest.approx(reduce)


def test_its_buffers_hold_a_module_or_two_not_two_layers():
    # The 530B on 640 GPUs at micro-batch 4 ran (Table 2); FSDP2's two gathered layers and one layer's fp32
    # gradients are 40 GB of it, DeepSpeed's live modules 13.4 GB.
    _, fsdp = plan(GPT530, 640, 2560, 4, "fsdp")
    _, deepspeed = plan(GPT530, 640, 2560, 4, "deepspeed-2021")
    assert fsdp.buffers == pytest.approx(40.3e9, rel=0.01)
    layer = ds.module_weights(GPT530, 12 * 20480**2)
    assert deepspeed.buffers == pytest.approx(2 * ds.buffer_elements(layer), rel=1e-3)
    assert deepspeed.buffers == pytest.approx(13.4e9, rel=0.01)


def test_the_setting_is_a_plan_flag(capsys):
    from shoal.cli.main import main

    assert main(["plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--gpu", "a100",
                 "--gpus", "64", "--dp", "64", "--tp", "1", "--pp", "1", "--zero", "3", "--micro-batch", "1",
                 "--recompute", "full", "--zero3-impl", "deepspeed-2021", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["zero3_impl"] == "deepspeed-2021"
