"""How a stack runs context parallelism (Workload.cp_comm, planner/context_parallel.py): Transformer Engine's
p2p ring hides each step behind attention; PyTorch's all-gather ring (torchtitan) hides its gather behind the
first attention call only, merges in fp32 and sends fp32 dK/dV, on K/V repeated to the query heads; shoal's
gathers wait. In-process and fast."""

import dataclasses

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.planner.context_parallel import buffer_bytes, exchanged_width, ring_pass_bytes
from shoal.planner.memory import memory
from shoal.planner.stacks import STACKS
from shoal.planner.timing import step_time
from shoal.planner.workload import Cluster, Workload

H100 = hardware.get_gpu("h100")
L8, L405 = PRESETS["llama3-8b"], PRESETS["llama3-405b"]


def test_stacks_name_the_exchange_they_run():
    assert STACKS["torchtitan"]["cp_comm"] == "torch-ring"
    assert STACKS["shoal"]["cp_comm"] == "all-gather"
    assert Workload(L8, 8192, 8).cp_comm == "p2p"  # Megatron-Core's default without --stack
    # torchtitan's repeat_kv: the K/V PyTorch's ring moves are as wide as the queries
    assert exchanged_width(L8, 1, "torch-ring") == 4 * exchanged_width(L8, 1, "p2p")


def test_torch_ring_merges_and_copies_grow_with_its_calls():
    tokens = 32768  # this rank's share, as in torchtitan's Table 2 rows (seq = cp x 32K)
    fused = [ring_pass_bytes(L8, tokens, 1, cp, "torch-ring", 2, True) for cp in (2, 4, 8)]
    te = ring_pass_bytes(L8, tokens, 1, 8, "p2p", 2, True)  # Transformer Engine adds in place, in 16 bits
    assert 0 < te[0] < fused[2][0] and 0 < te[1] < fused[2][1]
    eager = ring_pass_bytes(L8, tokens, 1, 8, "torch-ring", 2, False)
    assert 0 < fused[0][0] < fused[1][0] < fused[2][0] and fused[2][1] > fused[1][1] > fused[0][1] > 0
    assert eager[0] > 2 * fused[2][0] and eager[1] > fused[2][1]  # compiled, each merge is one pass
    q = tokens * L8.dim
    assert fused[2][0] > 8 * 10 * q  # a 16-bit read, an fp32 read and write per call and query element


def test_torch_ring_across_nodes_shows_its_fp32_gradients_and_gather():
    # Llama 3.1 405B, TP 8 x CP 4 x PP 8 (torchtitan Table 6): each cp rank in another node
    lay = Layout(dp_shard=2, tp=8, cp=4, pp=8, zero=3, micro_batch=1, activation_checkpoint="full",
                 sequence_parallel=True)
    cl = Cluster(dataclasses.replace(H100, hbm_bytes=96 * 2**30), 512, 8)
    ring = Workload(L405, 131072, 16, precision="fp8", cp_comm="p2p")
    torch = dataclasses.replace(ring, cp_comm="torch-ring")
    t_ring, t_torch = step_time(ring, lay, cl), step_time(torch, lay, cl)
    assert t_ring.cp_comm < 0.005 * t_ring.step  # the p2p ring hides behind each step's attention
    assert t_torch.cp_comm > 0.02 * t_torch.step  # the last fp32 dK/dV send and the gather's excess show
    assert t_torch.step > 1.04 * t_ring.step
    assert memory(torch, lay, cl).buffers > memory(ring, lay, cl).buffers


def test_shoal_gathers_wait_and_hold_the_whole_sequence():
    lay = Layout(dp_shard=1, cp=8, zero=3, micro_batch=1, activation_checkpoint="full")
    cl = Cluster(H100, 8, 8)
    wl = Workload(L8, 262144, 1, cp_comm="p2p")
    shoal = dataclasses.replace(wl, cp_comm="all-gather")
    assert step_time(shoal, lay, cl).cp_comm > 3 * step_time(wl, lay, cl).cp_comm
    tokens = 262144 / 8
    whole_kv_fp32 = 2 * 262144 * L8.dim * 4  # K and V of the whole sequence at the query heads' width
    assert buffer_bytes(L8, tokens, 1, 8, "all-gather", 2) > 2 * whole_kv_fp32
    assert buffer_bytes(L8, tokens, 1, 8, "p2p", 2) == pytest.approx(2 * 2 * tokens * 1024 * 2)


def test_ulysses_trades_heads_for_sequence_in_four_exchanges_each_way():
    """`a2a` (Megatron-Core's cp_comm_type a2a): Q, K, V in and the output back, each an all-to-all nothing hides,
    around one attention call on 1/cp of the heads; a rank must hold whole query and key/value heads."""
    from shoal.planner import collectives as coll
    from shoal.planner.context_parallel import heads_problem
    from shoal.planner.timing import network

    lay, cl = Layout(dp_shard=1, cp=8, zero=3, micro_batch=1, activation_checkpoint="none"), Cluster(H100, 8, 8)
    t = step_time(Workload(L8, 131072, 1, cp_comm="a2a"), lay, cl)
    tokens = 131072 / 8
    q, kv = tokens * L8.dim * 2, 2 * tokens * 1024 * 2  # this rank's queries; its keys and values (8 kv heads)
    net = network(cl).for_group(8, 1)
    each_way = 2 * coll.all_to_all(q, 8, 8, net) + coll.all_to_all(kv, 8, 8, net)
    assert t.cp_comm == pytest.approx(L8.n_layers * 2 * each_way)
    # three copies of each of the eight tensors (flash_attn_a2a_communicate), forward and backward alike
    fwd, bwd = ring_pass_bytes(L8, tokens, 1, 8, "a2a", 2, True)
    assert fwd == bwd == pytest.approx(3 * 4 * (2 * tokens * L8.dim + 2 * tokens * 1024))
    assert heads_problem(L8, 1, 8, "a2a") is None and heads_problem(L8, 1, 16, "p2p") is None
    assert heads_problem(L8, 1, 16, "a2a").field == "--cp"  # 8 kv heads cannot go to 16 ranks
    assert heads_problem(L8, 4, 4, "a2a").field == "--cp"  # tp 4 leaves each rank 2 kv heads
