"""The rank grid and the pipeline split: pure functions, no process group."""

import pytest

from shoal.config import load_config
from shoal.errors import UserError
from shoal.job import resolve
from shoal.parallel.mesh import ParallelDims
from shoal.parallel.pipeline import layer_split, stage_indices


def dims(world, **par):
    preset = "debug-moe" if par.get("ep", 1) > 1 else "debug"
    overrides = [f"model.preset={preset}", "train.global_batch=64", "train.micro_batch=1"]
    return ParallelDims.of(resolve(load_config(None, overrides + [f"parallel.{k}={v}" for k, v in par.items()]), world).layout)


def test_tp_is_innermost_and_pp_outermost():
    d = dims(8, tp=2, pp=2)
    g = d.groups()
    assert d.dp_shard == 2  # -1 took what was left
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # neighbours: one machine
    assert g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert d.coords(6) == {"pp": 1, "dp_replicate": 0, "dp_shard": 1, "cp": 0, "tp": 0, "dp": 1}


def test_hsdp_and_expert_groups():
    d = dims(8, dp_replicate=2, ep=2)
    assert d.dp == 8 and d.dp_shard == 4
    g = d.groups()
    assert g["dp"] == [list(range(8))]
    assert g["ep"] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # ep borrows neighbouring dp_shard ranks


def test_cp_sits_between_tp_and_dp():
    d = dims(16, tp=2, cp=2, pp=2)
    g = d.groups()
    assert d.dp_shard == 2 and "cp2" in resolve(load_config(None, ["parallel.cp=2"]), 2).layout.short()
    assert g["tp"][:2] == [[0, 1], [2, 3]]
    assert g["cp"][:2] == [[0, 2], [1, 3]]  # just outside tp
    assert g["dp"][:2] == [[0, 4], [1, 5]]
    assert g["pp"][0] == [0, 8]
    assert d.coords(6) == {"pp": 0, "dp_replicate": 0, "dp_shard": 1, "cp": 1, "tp": 0, "dp": 1}
    # an order that names cp puts it there; one that does not keeps it just outside tp
    assert dims(4, cp=2, rank_order="cp-tp-dp-pp").groups()["cp"] == [[0, 1], [2, 3]]
    assert dims(4, cp=2, tp=2, rank_order="dp-tp-pp").groups()["cp"] == [[0, 2], [1, 3]]


@pytest.mark.parametrize("par,match", [
    ({"cp": 3}, r"parallel.cp.*seq_len=.*divisible by 6"),
    ({"cp": 2, "model.preset": "debug-moe"}, "MoE"),
    ({"cp": 2, "dp_replicate": 2, "zero": 3}, "HSDP"),
    ({"cp": 2, "rank_order": "cp-tp-cp-dp-pp"}, "rank_order"),
])
def test_bad_cp_settings_are_one_line(par, match):
    overrides = ["train.seq_len=64", "train.global_batch=8"] + [
        f"{k}={v}" if "." in k else f"parallel.{k}={v}" for k, v in par.items()]
    world = 2 * par.get("dp_replicate", 1) * (par["cp"] if par["cp"] == 3 else 1)
    with pytest.raises(UserError, match=match):
        resolve(load_config(None, overrides), world)


def test_fsdp_over_dp_and_cp_refuses_an_order_that_puts_dp_inside_cp():
    """cp=2 x dp_shard=2 in order dp-tp-pp: torch's flattened dp_shard x cp mesh numbers its ranks
    [0, 2, 1, 3], DTensor placed FSDP's shards by it and the process group gathered them by rank
    (verify: 9.0e-3 in the first step's loss, 0.13 in the weights). zero=0/1 and cp named first matched."""
    from shoal.layout import TrainerLimit

    base = ["train.seq_len=64", "train.global_batch=8", "parallel.cp=2", "parallel.dp_shard=2"]
    for order in ("dp-tp-pp", "tp-dp-cp-pp"):
        with pytest.raises(TrainerLimit, match="puts dp inside cp.*cp-dp-tp-pp"):
            resolve(load_config(None, [*base, f"parallel.rank_order={order}"]), 4)
    for fine in (["parallel.rank_order=cp-dp-tp-pp"], ["parallel.rank_order=dp-tp-pp", "parallel.zero=1"],
                 ["parallel.rank_order=dp-tp-pp", "parallel.zero=0"]):
        resolve(load_config(None, [*base, *fine]), 4)


def test_every_rank_in_exactly_one_group_of_each_kind():
    d = dims(16, tp=2, pp=2, dp_replicate=2)
    for kind, groups in d.groups().items():
        assert sorted(r for grp in groups for r in grp) == list(range(16)), kind


def test_world_that_does_not_factor_says_what_would():
    with pytest.raises(UserError, match="options: tp=1 pp=1 dp=6"):
        dims(6, tp=4)


@pytest.mark.parametrize("n_layers,n_stages", [(4, 2), (7, 3), (32, 8), (126, 16)])
def test_layer_split_is_contiguous_and_balanced(n_layers, n_stages):
    split = layer_split(n_layers, n_stages)
    assert [i for r in split for i in r] == list(range(n_layers))
    sizes = [len(r) for r in split]
    assert max(sizes) - min(sizes) <= 1


def test_lighter_edges_move_layers_off_first_and_last_stage():
    even = [len(r) for r in layer_split(32, 4)]
    light = [len(r) for r in layer_split(32, 4, lighter_edges=2)]
    assert even == [8, 8, 8, 8]
    assert light == [6, 10, 10, 6]
    assert sum(light) == 32


def test_interleaved_stages_loop_over_ranks():
    assert stage_indices(0, 4, 2) == [0, 4] and stage_indices(3, 4, 2) == [3, 7]


def test_the_default_layouts_on_two_ranks_are_all_there():
    """DP at ZeRO 0-3, HSDP, TP with and without SP, four pipeline schedules, MoE with and without EP:
    what `shoal verify --nproc 2` runs (the README's quickstart runs it and must pass; not run twice)."""
    from shoal.train.parity import fitting_layouts

    layouts, skipped = fitting_layouts(2, 4)
    assert len(layouts) >= 13, layouts
    # A layout of N/4 ranks on 2 was explained as "parallel.dp_shard=0: must be a positive integer".
    assert ("tp=2,pp=2,dp_shard=N/4", "needs 4 ranks") in skipped, skipped
    for must in ("zero=1", "zero=0", "tp=2", "pp_schedule=zero-bubble", "pp_schedule=interleaved-1f1b", "ep=2"):
        assert any(must in layout for layout in layouts), (must, layouts)
