"""The planner and the trainer agree on what a layout is and which layouts run.

Both call shoal/layout_rules.py; these tests keep the two ends of that contract honest: every layout the
planner calls feasible passes the trainer's resolution with the same field values (through the
recipe it emits), and every layout the trainer accepts the planner can evaluate.
"""

import itertools

import pytest

from shoal.config import load_config
from shoal.errors import UserError
from shoal.job import resolve
from shoal.layout import Layout, TrainerLimit
from shoal.layout_rules import problems
from shoal.model.config import get_preset
from shoal import hardware
from shoal.planner.evaluate import evaluate
from shoal.planner.workload import Cluster, Workload
from shoal.planner.recipe import recipe_sections
from shoal.planner.search import search

PRESETS = ("debug", "tiny", "tiny-moe")
GLOBAL_BATCH, SEQ_LEN = 48, 64
H100 = hardware.get_gpu("h100")


def _overrides(sections: dict) -> list[str]:
    return [f"{section}.{key}={value}" for section, fields in sections.items() for key, value in fields.items()]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("world", range(1, 9))
def test_every_feasible_plan_is_a_recipe_the_trainer_accepts_unchanged(preset, world):
    wl = Workload(get_preset(preset), SEQ_LEN, GLOBAL_BATCH, precision="fp32")
    try:
        result = search(wl, Cluster(H100, world, 8), keep=1000)
    except UserError:
        return  # nothing divides (e.g. 7 ranks): the trainer must refuse every layout too (next test)
    if result.note:  # layouts for another trainer are not emitted
        assert all(p.trainer_limit is not None for p in result.plans)
        return
    assert result.plans
    for plan in result.plans:
        cfg = load_config(None, _overrides(recipe_sections(plan, preset=preset)))
        job = resolve(cfg, world)  # raises if the trainer refuses
        assert job.layout == plan.layout, (plan.layout, job.layout)


def _trainer_layouts(preset: str, world: int):
    """A grid of layouts on `world` ranks, as a user would write them."""
    moe = get_preset(preset).is_moe
    for tp, pp, dp_replicate, ep, zero, schedule, mb in itertools.product(
            (1, 2, 4), (1, 2, 4), (1, 2), (1, 2, 4) if moe else (1,), (0, 1, 2, 3),
            ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble"), (0, 1, 2, 4)):
        if (pp == 1 and schedule != "1f1b") or world % (tp * pp * dp_replicate):
            continue
        yield [f"model.preset={preset}", f"train.global_batch={GLOBAL_BATCH}", f"train.seq_len={SEQ_LEN}",
               f"train.micro_batch={mb}", f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.ep={ep}",
               f"parallel.dp_replicate={dp_replicate}", f"parallel.zero={zero}", f"parallel.pp_schedule={schedule}"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("world", (1, 2, 4, 6, 8))
def test_every_layout_the_trainer_accepts_the_planner_evaluates(preset, world):
    accepted = refused = 0
    for overrides in _trainer_layouts(preset, world):
        try:
            job = resolve(load_config(None, overrides), world)
        except UserError:
            refused += 1
            continue
        accepted += 1
        wl = Workload(job.model, SEQ_LEN, GLOBAL_BATCH, precision="fp32")
        plan = evaluate(wl, job.layout, Cluster(H100, world, 8))  # raises if the planner refuses
        assert plan.trainer_limit is None and plan.time.step > 0
    assert accepted > 0


def test_a_trainer_limit_is_sound_but_not_runnable():
    """MoE with tensor parallelism is a layout other trainers run: the planner evaluates it, shoal
    train refuses it, both from the same rule."""
    moe = get_preset("tiny-moe")
    found = problems(Layout(tp=2, dp_shard=2), moe, 4, GLOBAL_BATCH, SEQ_LEN)
    assert found and all(isinstance(p, TrainerLimit) for p in found)
    with pytest.raises(UserError, match="parallel.tp=2"):
        resolve(load_config(None, ["model.preset=tiny-moe", "parallel.tp=2"]), 4)


def test_the_issue_recipe_is_emitted_runnable(tmp_path):
    """`shoal plan ... --pp 4 --micro-batch 4` once wrote pp_microbatches=1, which 1f1b refuses."""
    from shoal.cli.main import main

    out = tmp_path / "x.toml"
    code = main(["plan", "--model", "tiny", "--seq-len", "256", "--global-batch", "4", "--gpu", "h100", "--gpus", "4",
                 "--pp", "4", "--dp", "1", "--tp", "1", "--zero", "0", "--micro-batch", "4", "--recompute", "none",
                 "--emit", str(out)])
    assert code == 0
    job = resolve(load_config(out), 4)
    assert job.layout.pp == 4 and job.layout.micro_batch == 4 and job.layout.pp_schedule == "gpipe"


@pytest.mark.parametrize("pp,virtual,n_layers,fix", [
    (2, 4, 4, "lower parallel.pp_virtual_stages to at most 2"),  # was "use at most 1": pp=1 cannot interleave
    (4, 1, 4, None),
    (8, 1, 4, "use at most pp=4"),
    (4, 2, 4, "use at most pp=2, or pp_schedule=1f1b"),
    (2, 2, 3, "use pp_schedule=1f1b"),
])
def test_too_many_pipeline_stages_names_a_fix_that_runs(pp, virtual, n_layers, fix):
    schedule = "interleaved-1f1b" if virtual > 1 else "1f1b"
    model = get_preset("debug").replace(n_layers=n_layers)
    lay = Layout(pp=pp, pp_schedule=schedule, pp_virtual_stages=virtual, micro_batch=1)
    found = [p for p in problems(lay, model, pp, 8 * pp, 32) if "pipeline stages" in p.fix]
    assert [fix in p.fix for p in found] == ([True] if fix else []), [p.fix for p in found]
