"""Straggler warnings during training: only a rank that stays slow, above the CPU time-sharing, in one line."""

import warnings

import pytest

from shoal.debug import stragglers


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(stragglers, "_warned", set())
    monkeypatch.setattr(stragglers, "_streak", {})


def test_a_rank_is_named_after_persist_steps_slow_steps_in_a_row_once():
    slow = {0: 0.1, 1: 0.1, 2: 0.3}
    named = [stragglers.persistent_stragglers(slow, 0.7) for _ in range(stragglers.PERSIST_STEPS + 2)]
    assert named == [[]] * (stragglers.PERSIST_STEPS - 1) + [[2], [], []]


def test_one_slow_step_is_noise():
    calm, spike = {0: 0.1, 1: 0.1, 2: 0.1}, {0: 0.1, 1: 0.1, 2: 0.5}
    for times in [spike, spike, calm] * 3:  # never PERSIST_STEPS in a row
        assert stragglers.persistent_stragglers(times, 0.7) == []


def test_time_sharing_a_core_raises_the_bar(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(stragglers.os, "sched_getaffinity", lambda pid: {0, 1})
    sharing = stragglers.ranks_per_core()
    assert sharing == 2.0
    twice_as_slow = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.2}  # what 4 ranks on 2 cores do by construction
    for _ in range(stragglers.PERSIST_STEPS):
        assert stragglers.persistent_stragglers(twice_as_slow, stragglers.THRESHOLD / sharing) == []
    four_times = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.4}
    assert [stragglers.persistent_stragglers(four_times, stragglers.THRESHOLD / sharing)
            for _ in range(stragglers.PERSIST_STEPS)][-1] == [3]


def test_the_warning_is_one_line_without_source():
    with warnings.catch_warnings(record=True) as caught:  # still recorded: only its printing changes
        warnings.simplefilter("always")
        stragglers._warn("rank 3 is a straggler: test")
        warnings.warn("another warning keeps its usual form", UserWarning)
    # what Python prints for each (its printer calls warnings.formatwarning once it is replaced)
    shown = [warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught]
    assert shown[0] == "shoal: warning: rank 3 is a straggler: test\n"
    assert "UserWarning: another warning keeps its usual form" in shown[1] and __file__ in shown[1]
