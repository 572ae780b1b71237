"""The `local` hardware model: ranks sharing a host's cores, glibc's allocator slack, and the
emulated two-node cluster's hardware file built on it."""

import dataclasses
from pathlib import Path

import pytest

from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal import hardware
from shoal.hardware import local as local_hardware
from shoal.planner.evaluate import evaluate
from shoal.planner.workload import Cluster, Workload

PROFILE = {"cpu_count": 2, "memory_bytes": 8 * 2**30, "matmul_fp32_flops": 100e9, "matmul_bf16_flops": 50e9,
           "copy_bandwidth": 40e9, "gloo_busbw": 1e9, "gloo_latency": 50e-6, "kernel_overhead": 6e-6}
TWO_NODES = Path(__file__).parents[2] / "recipes" / "hardware" / "emulated-two-node.toml"


def test_ranks_beyond_the_cores_time_share_them():
    local = local_hardware.gpu_from_profile(PROFILE)
    one = local_hardware.local_for_ranks(local, 1)  # a single process runs torch's threads on every core
    assert one.peak_fp32_flops == 200e9 and one.hbm_bandwidth == 80e9
    assert local_hardware.local_for_ranks(local, 2) == local  # one rank per core: the profile as measured
    four = local_hardware.local_for_ranks(local, 4)
    assert (four.peak_fp32_flops, four.hbm_bandwidth, four.intra_node_bandwidth) == (50e9, 20e9, 0.5e9)
    assert (four.kernel_gap, four.intra_node_latency) == (12e-6, 100e-6)
    h100 = hardware.get_gpu("h100")
    assert local_hardware.local_for_ranks(h100, 16) is h100  # a GPU is never shared this way
    wl = Workload(PRESETS["tiny"], 256, 16, precision="fp32")
    lay = Layout(dp_shard=2, tp=2, zero=1, micro_batch=8)
    shared = evaluate(wl, lay, Cluster(four, 4, 4)).time
    alone = evaluate(wl, lay, Cluster(local, 4, 4)).time  # as if each rank had its own core
    assert shared.compute == pytest.approx(2 * alone.compute, rel=0.01) and shared.tp_comm > 1.9 * alone.tp_comm


def test_local_memory_counts_the_allocators_slack():
    local = local_hardware.gpu_from_profile(PROFILE)
    wl = Workload(PRESETS["tiny"], 256, 16, precision="fp32")
    mem = evaluate(wl, Layout(micro_batch=8), Cluster(local, 1, 1)).memory
    dynamic = mem.activations + mem.logits + mem.buffers
    assert mem.overhead == pytest.approx(local_hardware.LOCAL_PROCESS_BYTES + local_hardware.LOCAL_ALLOCATOR_SLACK * dynamic)
    gpu_mem = evaluate(wl, Layout(micro_batch=8), Cluster(dataclasses.replace(local, allocator_slack=0.0), 1, 1)).memory
    assert gpu_mem.overhead < mem.overhead  # 0: a GPU caching allocator's 5%


def test_emulated_two_node_file_gives_the_link_between_nodes(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    (tmp_path / "local_profile.json").write_text(json.dumps(PROFILE))
    gpu = hardware.load_hw_file(TWO_NODES, None)
    assert local_hardware.is_local(gpu) and gpu.name == "local+emulated-two-node"
    assert gpu.inter_busbw < gpu.intra_busbw / 20  # 400 Mbit/s shared by two ranks against loopback
    two_per_node = local_hardware.local_for_ranks(gpu, 2)  # one core per node: two ranks share it
    assert two_per_node.peak_fp32_flops == PROFILE["matmul_fp32_flops"] / 2
    wl = Workload(PRESETS["tiny"], 256, 16, precision="fp32")
    lay = Layout(dp_shard=4, zero=0, micro_batch=4)
    across = evaluate(wl, lay, Cluster(two_per_node, 4, 2)).time  # the gradient all-reduce crosses the link
    inside = evaluate(wl, lay, Cluster(two_per_node, 4, 4)).time
    assert across.dp_comm_total > 5 * inside.dp_comm_total  # 24 MB/s per rank across against 1 GB/s inside


def test_measured_attention_and_dtensor_costs_reach_the_plan():
    measured = dict(PROFILE, attention_efficiency=0.25, tp_kernel_overhead=100e-6)
    old, new = local_hardware.gpu_from_profile(PROFILE), local_hardware.gpu_from_profile(measured)
    assert (old.attention_efficiency, old.tp_kernel_overhead) == (0.5, 0.0)  # a profile from before both
    wl = Workload(PRESETS["tiny"], 256, 16, precision="fp32")
    dp, tp = Layout(dp_shard=2, zero=0, micro_batch=8), Layout(tp=2, zero=0, micro_batch=8)
    t_old, t_new = (evaluate(wl, tp, Cluster(g, 2, 2)).time for g in (old, new))
    # Attention: each rank's half of the batch's 4·B·S²·D in 6 layers, counted 1.75x (causal forward
    # plus 2.5x backward), at a quarter of the matmul rate instead of a half.
    attention = 6 * 1.75 * 4 * 16 * 256 * 256 * 256 / 2 / 100e9 * (1 / 0.25 - 1 / 0.5)
    # DTensor: 2 micro-batches x (6 layers x 24 + 6 head kernels) x 3 (backward counts twice) x 100 us.
    assert t_new.compute - t_old.compute == pytest.approx(attention + 2 * 150 * 3 * 100e-6, rel=0.01)
    d_old, d_new = (evaluate(wl, dp, Cluster(g, 2, 2)).time for g in (old, new))
    assert d_new.compute - d_old.compute == pytest.approx(attention, rel=0.01)  # no DTensor without tp
    assert local_hardware.local_for_ranks(new, 4).tp_kernel_overhead == 200e-6  # two ranks a core: twice as long


def test_measured_redistribution_cost_reaches_each_tensor_parallel_collective():
    """DTensor's cost per sequence-parallel collective: 4 a layer forward, 4 backward, per micro-batch;
    without sequence parallelism 2 all-reduces each way, which copy nothing, so the latency alone."""
    measured = local_hardware.gpu_from_profile(dict(PROFILE, tp_redistribute_latency=500e-6,
                                                    tp_redistribute_per_byte=1e-9))
    plain = local_hardware.gpu_from_profile(PROFILE)
    wl = Workload(PRESETS["tiny"], 256, 16, precision="fp32")
    act = 8 * 256 * 256 * 4  # one micro-batch's [8, 256, 256] fp32 activation
    for sp, per_collective, collectives in ((True, 500e-6 + act * 1e-9, 8), (False, 500e-6, 4)):
        lay = Layout(tp=2, zero=0, micro_batch=8, sequence_parallel=sp)
        extra = evaluate(wl, lay, Cluster(measured, 2, 2)).time.tp_comm - evaluate(wl, lay, Cluster(plain, 2, 2)).time.tp_comm
        assert extra == pytest.approx(2 * 6 * collectives * per_collective)  # 2 micro-batches, 6 layers
    assert local_hardware.local_for_ranks(measured, 4).tp_redistribute_per_byte == 2e-9  # two ranks a core


def test_one_process_pays_the_per_kernel_cost_measured_on_every_core():
    threaded = local_hardware.gpu_from_profile(dict(PROFILE, kernel_overhead_all_cores=15e-6))
    assert local_hardware.local_for_ranks(threaded, 1).kernel_gap == 15e-6  # torch's threads on both cores
    assert local_hardware.local_for_ranks(threaded, 2).kernel_gap == 6e-6  # one thread per rank
    old = local_hardware.gpu_from_profile(PROFILE)  # a profile from before: the one-thread cost
    assert local_hardware.local_for_ranks(old, 1).kernel_gap == 6e-6


def test_an_unfused_optimizer_step_pays_each_tensors_dispatch():
    """CPU ranks update one tensor at a time (AdamW and the clip with foreach=False); on DTensors (TP,
    FSDP2) each op pays DTensor's host work too; ZeRO-1 updates its own 1/dp; GPUs run fused AdamW."""
    from shoal.planner.timing import ADAMW_OPS_PER_TENSOR, CLIP_OPS_PER_TENSOR

    local = local_hardware.gpu_from_profile(dict(PROFILE, tp_kernel_overhead=100e-6))
    wl = Workload(PRESETS["tiny"], 256, 16, precision="fp32")  # 57 parameter tensors

    def optimizer(lay: Layout, gpu=local) -> float:
        return evaluate(wl, lay, Cluster(gpu, lay.world, 2)).time.optimizer

    streaming = optimizer(Layout(micro_batch=16), dataclasses.replace(local, kernel_gap=0.0))
    ops = (ADAMW_OPS_PER_TENSOR + CLIP_OPS_PER_TENSOR) * 57
    assert optimizer(Layout(micro_batch=16)) == pytest.approx(streaming + ops * 6e-6)
    sharded = optimizer(Layout(dp_shard=2, zero=3, micro_batch=8))  # FSDP2: DTensors, half the bytes
    assert sharded == pytest.approx(streaming / 2 + ops * 106e-6)
    assert optimizer(Layout(tp=2, zero=0, micro_batch=16)) > 0.9 * ops * 106e-6
    zero1 = optimizer(Layout(dp_shard=2, zero=1, micro_batch=8))  # DDP: plain tensors, 1/2 of them updated
    assert zero1 == pytest.approx(streaming / 2 + (ADAMW_OPS_PER_TENSOR * 57 / 2 + CLIP_OPS_PER_TENSOR * 57) * 6e-6)
    h100 = hardware.get_gpu("h100")
    assert optimizer(Layout(tp=2, zero=0, micro_batch=16), h100) < 1e-4  # fused: no per-tensor term


@pytest.mark.parametrize("profile", ["{garbled", "[1]", '{"cpu_count": 2}', '{"matmul_bf16_flops": "fast"}'])
def test_a_damaged_local_profile_is_one_line(profile, tmp_path, monkeypatch):
    """A cached measurement that is not JSON, not a dict or lacks a number: one UserError saying to
    measure again (it was a JSONDecodeError, AttributeError or KeyError traceback in `shoal plan --gpu local`)."""
    from shoal.errors import UserError
    from shoal.hardware.local import local_gpu

    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    (tmp_path / "local_profile.json").write_text(profile)
    with pytest.raises(UserError, match="is damaged .*--remeasure"):
        local_gpu()
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "local_profile.json"))  # a file: no folder there
    with pytest.raises(UserError, match=r"SHOAL_CACHE_DIR"):
        local_gpu(remeasure=True)


def test_launchers_starting_at_once_measure_the_machine_once(tmp_path, monkeypatch):
    """One asking for the `local` profile while another measures it waits, then reads what that one wrote
    (shoal.cache.one_filler), where both measured: two runs started at once on a fresh machine, or two
    pytest workers."""
    import json
    import threading
    import time

    from shoal.cache import one_filler

    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    path = tmp_path / "local_profile.json"
    measuring = threading.Event()

    def first():
        with one_filler(path):
            measuring.set()
            time.sleep(0.3)
            path.write_text(json.dumps(PROFILE))

    other = threading.Thread(target=first)
    other.start()
    measuring.wait()
    monkeypatch.setattr(local_hardware, "_measure", lambda path: pytest.fail("measured a second time"))
    assert local_hardware.local_gpu().peak_fp32_flops == PROFILE["matmul_fp32_flops"]
    other.join()
