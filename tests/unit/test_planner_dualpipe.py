"""DualPipe (DeepSeek-V3 §3.2.1, Table 2): planned from the paper's bubble and memory, refused by shoal train."""

import pytest

from shoal import hardware
from shoal.cli.main import main
from shoal.errors import UserError
from shoal.layout import Layout, TrainerLimit
from shoal.layout_rules import problems
from shoal.model.config import PRESETS
from shoal.planner import pipeline
from shoal.planner.memory import activation_bytes_per_layer, memory, rank_params
from shoal.planner.timing import step_time
from shoal.planner.workload import Cluster, Workload

H100 = hardware.get_gpu("h100")
MIXTRAL = PRESETS["mixtral-8x7b"]  # 32 layers: equal stages at pp 4 (8 each), so Table 2's units hold exactly


def test_bubble_is_table_2s():
    F, B, W = 1.0, 2.0, 0.8
    assert pipeline.bubble("dualpipe", 8, 1, F, B, W) == pytest.approx((8 / 2 - 1) * ((F + B) + B - 3 * W))
    assert pipeline.bubble("1f1b", 8, 1, F, B, W) == pytest.approx((8 - 1) * (F + B))
    assert pipeline.bubble("zero-bubble", 8, 2, F, B, W) == pytest.approx((8 - 1) * (F + B) / 6)
    assert pipeline.bubble("dualpipe", 1, 1, F, B, W) == 0.0


def test_paired_chunks_follow_the_reference_schedule():
    # deepseek-ai/DualPipe, 8 ranks and 20 micro-batches (its README's figure): rank 0 runs step 4 for
    # 20/2 - 8 + 1 = 3 iterations of two F&B pairs, then step 5 for 8/2 - 1 = 3 pairs: 9 of its 20.
    assert pipeline.dualpipe_paired_share(8, 20) == pytest.approx(9 / 20)


def _plan(schedule: str, zero: int = 0, ep: int = 1, gpus: int = 64, batch: int = 512):
    wl = Workload(MIXTRAL, 4096, batch)
    lay = Layout(dp_shard=gpus // 4, pp=4, ep=ep, zero=zero, micro_batch=1, pp_schedule=schedule)
    assert not [p for p in problems(lay, MIXTRAL, gpus, batch, 4096) if not isinstance(p, TrainerLimit)]
    cluster = Cluster(H100, gpus, 8)
    return wl, lay, memory(wl, lay, cluster), step_time(wl, lay, cluster)


def test_memory_is_table_2s_two_stages_and_pp_plus_one_chunks():
    wl, lay, dual, _ = _plan("dualpipe")
    _, _, plain, _ = _plan("1f1b")
    assert dual.stage == "edges"
    # Activations: PP + 1 chunks of a stage against 1F1B's PP (equal stages: 8 layers each).
    per_layer = activation_bytes_per_layer(wl, lay)
    assert dual.activations == pytest.approx(per_layer * 8 * (4 + 1))
    assert dual.activations / plain.activations == pytest.approx((4 + 1) / 4)
    # Parameters: rank 0 holds the first and the last stage (2x; the edges carry the embedding and the head),
    # 2 bytes of weights and 2 of gradients each at zero 0.
    first, last = (rank_params(MIXTRAL, 1, 1, 4, 1, s) for s in ("first", "last"))
    both = first.dense + first.expert + last.dense + last.expert
    assert dual.params == pytest.approx(2 * both) and dual.grads == pytest.approx(2 * both)
    assert plain.params == pytest.approx(2 * (first.dense + first.expert))


def test_zero_shards_a_stage_over_both_ranks_that_hold_it():
    _, _, dual, _ = _plan("dualpipe", zero=1)
    _, _, plain, _ = _plan("1f1b", zero=1)
    # Twice the parameters over twice the ranks: the optimizer state per GPU is 1F1B's first stage and last
    # stage, halved.
    first, last = (rank_params(MIXTRAL, 1, 1, 4, 1, s) for s in ("first", "last"))
    assert dual.optimizer == pytest.approx(12 * (first.dense + first.expert + last.dense + last.expert) / 32)
    assert plain.optimizer == pytest.approx(12 * (first.dense + first.expert) / 16)


def test_pairs_hide_the_expert_exchange_inside_a_node_too():
    # EP 8 inside an 8-GPU node: no recipe overlaps it under 1F1B (timing._ep_comm); DualPipe's pairs do.
    _, _, _, dual = _plan("dualpipe", ep=8)
    _, _, _, plain = _plan("1f1b", ep=8)
    assert 0 < dual.ep_comm < 0.9 * plain.ep_comm
    assert dual.bubble < plain.bubble and dual.pp_comm < plain.pp_comm
    # The head runs on half the busiest rank's micro-batches (rank 0 holds the first and the last stage).
    assert dual.compute < plain.compute


def test_layout_rules():
    lay = Layout(dp_shard=16, pp=4, micro_batch=1, pp_schedule="dualpipe")
    found = problems(lay, MIXTRAL, 64, 512, 4096)
    assert [(type(p), p.field) for p in found] == [(TrainerLimit, "parallel.pp_schedule")]
    odd = problems(Layout(dp_shard=16, pp=3, micro_batch=1, pp_schedule="dualpipe"), MIXTRAL, 48, 512, 4096)
    assert any(type(p) is UserError and p.field == "parallel.pp" for p in odd)
    # 512 / 16 = 32 sequences per rank: micro-batch 8 leaves 4 < 2*pp micro-batches; the fix names 4 (8 of them).
    few = problems(Layout(dp_shard=16, pp=4, micro_batch=8, pp_schedule="dualpipe"), MIXTRAL, 64, 512, 4096)
    bad = [p for p in few if type(p) is UserError]
    assert [p.field for p in bad] == ["train.micro_batch"] and "train.micro_batch=4" in bad[0].fix


def test_shoal_train_refuses_dualpipe_in_one_line(capsys, tmp_path):
    rc = main(["train", "--nproc", "2", "--set", "model.preset=debug", "--set", "parallel.pp=2", "--set",
               "parallel.dp_shard=1", "--set", "parallel.pp_schedule=dualpipe", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "parallel.pp_schedule" in err and "dualpipe" in err and "zero-bubble" in err
    assert not (tmp_path / "o").exists()  # refused before anything ran
