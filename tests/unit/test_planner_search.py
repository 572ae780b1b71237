"""The search's shortcuts (search._Floors, search._best, the pass skipped for a model shoal train never runs)
change how long it takes, never what it returns."""

from collections import Counter, defaultdict
from dataclasses import replace
from types import SimpleNamespace

import pytest

from shoal import hardware
from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.planner import search as search_module
from shoal.planner.memory import memory
from shoal.planner.search import Fixed, _Floors as Floors, candidate_groups, search
from shoal.planner.timing import step_floor, step_time
from shoal.planner.workload import Cluster, Workload

CASES = [  # (model, seq, batch, gpu, gpus): dense and MoE, with layouts that miss memory and layouts that fit
    ("mixtral-8x7b", 4096, 256, "h100", 32),
    ("llama3-70b", 8192, 128, "a100", 64),
    ("deepseek-v2", 4096, 128, "h200", 24),  # multi-head latent attention: the second pass only
]


def _outcome(result) -> tuple:
    def plans(ps):
        return [(p.layout, p.time.step, p.memory.total) for p in ps]
    return (plans(result.plans), plans(result.closest_misses), result.evaluated, result.fitting, result.dominated,
            dict(result.rejected), result.note)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_shortcuts_change_nothing_the_search_returns(case, monkeypatch):
    model, seq, batch, gpu, n = case
    wl, cl = Workload(PRESETS[model], seq, batch), Cluster(hardware.get_gpu(gpu), n, 8)
    fast = search(wl, cl, keep=3, misses=3)  # three kept: the floors cut most
    monkeypatch.setattr(Floors, "cannot_fit", lambda self, states, acts=None: False)
    monkeypatch.setattr(search_module, "step_floor", lambda w, lay, c: 0.0)
    monkeypatch.setattr(search_module, "model_limits", lambda m: [])
    slow = search(wl, cl, keep=3, misses=3)
    assert _outcome(fast) == _outcome(slow)
    assert fast.plans and fast.closest_misses


def test_floors_read_only_what_their_siblings_share():
    """A stage's weights, gradients and optimizer do not move with the micro-batch or the recompute mode, its
    activations not with ep or ZeRO, and the step floor not with ZeRO and never above the step."""
    model, seq, batch, gpu, n = CASES[0]
    wl, cl = Workload(PRESETS[model], seq, batch), Cluster(hardware.get_gpu(gpu), n, 8)
    groups = list(candidate_groups(wl, n, Fixed(), Counter(), max_tp=8))
    layouts = [replace(base, activation_checkpoint=rc) for base, rcs in groups[::7] for rc in rcs]
    states, acts, floors = defaultdict(set), defaultdict(set), defaultdict(set)
    for lay in layouts:
        mem = memory(wl, lay, cl)
        akey = Floors._activation_key(lay, lay.activation_checkpoint)
        states[Floors._state_key(lay), mem.stage].add(mem.params + mem.grads + mem.optimizer)
        acts[akey, mem.stage].add(mem.activations)
        if mem.fits:
            floor = step_floor(wl, lay, cl)
            assert floor <= step_time(wl, lay, cl).step
            floors[akey, lay.ep].add(floor)
    for table in (states, acts, floors):
        assert table and all(len(values) == 1 for values in table.values())
    siblings = Counter(Floors._state_key(lay) for lay in layouts)
    assert max(siblings.values()) > 1  # the sample does compare siblings


def test_a_layout_that_could_be_a_closer_miss_is_computed():
    floors = Floors(capacity=100.0, reserved=0.0, misses=2)

    def cannot_fit(lay, rc=None):
        return floors.cannot_fit(floors.states_of(lay), rc and floors.activations_of(lay, rc))

    a, b, c = (Layout(dp_shard=8, pp=2, zero=z) for z in (0, 1, 2))  # ZeRO siblings: the same activations

    def saw(lay, states, activations):
        total = states + activations
        floors.saw_memory(lay, SimpleNamespace(stage="first", params=states, grads=0.0, optimizer=0.0,
                                               activations=activations, fits=total <= 100.0, total=total))

    saw(a, 140.0, 5.0)
    assert not cannot_fit(a)  # fewer misses than are shown so far: compute it
    saw(b, 100.0, 5.0)
    saw(c, 105.0, 5.0)  # the two misses shown so far: 105 and 110
    assert cannot_fit(replace(a, micro_batch=2))  # 140 of states alone, above both
    assert not cannot_fit(replace(c, micro_batch=2))  # 105 may still make a miss closer than 110
    assert not cannot_fit(c, "none")  # 110 ties the second miss: computed, ties keep their order
    d = Layout(dp_shard=8, pp=2, zero=3, micro_batch=2)
    saw(d, 99.0, 21.0)
    assert not cannot_fit(replace(d, micro_batch=4))  # 99 of states fits
    assert cannot_fit(d, "none")  # with its 21 of activations: 120, above both misses shown
