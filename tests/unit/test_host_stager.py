"""The async checkpoint's host stager on torches whose DefaultStager cannot stage twice (2.11 empties
its copy table after every stage; found on an H200): a probe finds out, and each save then gets a
fresh stager. CI's torch reuses its stager, so the fresh-stager path is forced here."""

import pytest
import torch

from shoal.checkpoint import checkpointer


class OneShotStager:
    """Stages once, then fails as torch 2.11's DefaultStager does."""

    def __init__(self):
        self.used = False

    def stage(self, state):
        if self.used:
            raise KeyError(type)
        self.used = True
        return state

    def close(self):
        pass


def test_the_probe_finds_a_one_shot_stager():
    assert checkpointer._stages_twice(OneShotStager()) is False


@pytest.mark.parametrize("one_shot", [False, True], ids=["installed-torch", "one-shot"])
def test_each_save_gets_a_private_copy(monkeypatch, one_shot):
    if one_shot:
        monkeypatch.setattr(checkpointer, "_stages_twice", lambda stager: False)
    stager = checkpointer._HostStager()
    for value in (1.0, 2.0, 3.0):
        live = {"w": torch.full((3,), value), "optim": {"lr": 0.1, "betas": (0.9, 0.95)}}
        staged = stager.stage(live)
        live["w"].add_(10)  # training goes on changing the live tensor
        assert staged["w"].tolist() == [value] * 3 and staged["optim"] == {"lr": 0.1, "betas": (0.9, 0.95)}
    stager.close()
