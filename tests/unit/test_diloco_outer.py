"""DiLoCo's outer step in one process (a gloo group of one): its sign, its Nesterov arithmetic, and
the streaming schedule and fragments (parallel/diloco.py). Two groups: tests/dist/test_diloco.py."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from shoal.model.config import ModelConfig
from shoal.model.transformer import build_model, cross_entropy
from shoal.parallel.diloco import DiLoCo, due_fragments, split_fragments


@pytest.fixture(scope="module")
def one_group(tmp_path_factory):
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _cfg(**kw):
    base = dict(diloco_inner_steps=5, diloco_outer_lr=0.7, diloco_outer_momentum=0.9, diloco_fragments=1,
                diloco_quantize="none", diloco_overlap_steps=0)
    return SimpleNamespace(**base | kw)


def test_an_outer_step_lowers_the_loss(one_group):
    """H inner SGD steps on one batch, then DiLoCo's outer step (lr 0.7, Nesterov 0.9): the outer
    parameters' loss falls. With the sign flipped (outer += lr * delta, the bug torchft and
    torchtitan shipped) the step walks away from what the inner steps learnt and the loss rises."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=2, vocab_size=64, max_seq_len=16), seed=0)
    x, y = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))

    def loss() -> float:
        with torch.no_grad():
            return float(cross_entropy(model(x), y))

    diloco = DiLoCo([model], one_group, _cfg(), replica=0)
    before = loss()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, 6):
        opt.zero_grad()
        cross_entropy(model(x), y).backward()
        opt.step()
        diloco.after_step(step, last=False)
    after = loss()
    assert after < before - 0.01, (before, after)
    # the outer step happened at step 5 and moved past the inner result (1.9 * 0.7 = 1.33 of the
    # pseudo-gradient on the first step): its parameters now equal the outer copy
    for n, p in diloco.params.items():
        assert torch.equal(p, diloco.outer[n])


def test_nesterov_arithmetic_matches_torch_sgd(one_group):
    """Two outer steps on a single tensor equal torch.optim.SGD(nesterov=True) fed the pseudo-gradients."""
    model = torch.nn.Linear(3, 2, bias=False)
    ref = model.weight.detach().clone().requires_grad_()
    sgd = torch.optim.SGD([ref], lr=0.7, momentum=0.9, nesterov=True)
    diloco = DiLoCo([model], one_group, _cfg(diloco_inner_steps=1), replica=0)
    for step in (1, 2):
        with torch.no_grad():
            model.weight.sub_(torch.full_like(model.weight, 0.1 * step))  # an "inner step"
        ref.grad = torch.full_like(ref, 0.1 * step)  # the pseudo-gradient it makes
        diloco.after_step(step, last=False)
        sgd.step()
        assert torch.allclose(model.weight, ref, atol=1e-7)


def test_the_last_step_lands_on_the_mean_without_a_momentum_step(one_group):
    """Outer lr 0.7, Nesterov 0.9, H=2: step 2 is an outer step (momentum now holds its pseudo-
    gradient); on the run's last step, 3, the model becomes the groups' mean (here: one group's own
    weights), not a Nesterov step past it, and the momentum is left as it was."""
    model = torch.nn.Linear(3, 2, bias=False)
    diloco = DiLoCo([model], one_group, _cfg(diloco_inner_steps=2), replica=0)
    for step in (1, 2, 3):
        with torch.no_grad():
            model.weight.sub_(0.1)  # an "inner step"
        inner = model.weight.detach().clone()
        buf = diloco.buf[next(iter(diloco.buf))].clone()
        diloco.after_step(step, last=step == 3)
    assert torch.equal(model.weight, inner) and torch.equal(diloco.outer[next(iter(diloco.outer))], inner)
    assert buf.abs().sum() > 0 and torch.equal(diloco.buf[next(iter(diloco.buf))], buf)


def test_an_overlapped_outer_step_lands_tau_steps_later_mixed_half_and_half(one_group):
    """H=4, tau=2, outer lr 1, no momentum, one group: the pseudo-gradient sent after step 4 is applied
    after step 6; the outer copy becomes step 4's weights and the weights the mean of theirs and it."""
    model = torch.nn.Linear(3, 2, bias=False)
    w0 = model.weight.detach().clone()
    diloco = DiLoCo([model], one_group, _cfg(diloco_inner_steps=4, diloco_outer_lr=1.0, diloco_outer_momentum=0.0,
                                             diloco_overlap_steps=2), replica=0)
    outer = diloco.outer[next(iter(diloco.outer))]
    for step in range(1, 7):
        with torch.no_grad():
            model.weight.sub_(0.1)  # an "inner step"
        diloco.after_step(step, last=False)
        if step in (4, 5):  # sent, not applied yet: the group trains on
            assert len(diloco.in_flight) == 1 and torch.equal(outer, w0)
            assert torch.allclose(model.weight, w0 - 0.1 * step)
    assert not diloco.in_flight
    assert torch.allclose(outer, w0 - 0.4, atol=1e-6)
    assert torch.allclose(model.weight, 0.5 * (w0 - 0.6) + 0.5 * (w0 - 0.4), atol=1e-6)


def test_a_checkpoint_applies_what_is_in_flight(one_group):
    model = torch.nn.Linear(3, 2, bias=False)
    diloco = DiLoCo([model], one_group, _cfg(diloco_inner_steps=2, diloco_outer_lr=1.0, diloco_outer_momentum=0.0,
                                             diloco_overlap_steps=1), replica=0)
    for step in (1, 2):
        with torch.no_grad():
            model.weight.sub_(0.1)
        diloco.after_step(step, last=False)
    assert diloco.in_flight
    saved = diloco.capture({}, {})
    assert not diloco.in_flight and torch.equal(saved[f"outer.{next(iter(diloco.outer))}"], model.weight)


def test_fragments_sync_on_a_staggered_schedule():
    # H=6, F=3: fragment 0 at step % 6 == 0, fragment 1 at 2, fragment 2 at 4
    assert [due_fragments(s, 6, 3) for s in range(1, 13)] == [[], [1], [], [2], [], [0]] * 2
    assert all(due_fragments(s, 5, 1) == ([0] if s % 5 == 0 else []) for s in range(1, 11))  # F=1: plain DiLoCo
    # contiguous, each fragment about total/F, and every parameter in exactly one
    assert split_fragments([10, 10, 10, 10, 10, 10], 3) == [0, 0, 1, 1, 2, 2]
    assert split_fragments([50, 1, 1, 48], 2) == [0, 1, 1, 1]


@pytest.mark.parametrize("changes,field", [
    (dict(dp_replicate=1, dp_shard=2), "parallel.diloco_inner_steps"),
    (dict(grad_compression="bf16"), "parallel.grad_compression"),
    (dict(zero=1), "parallel.zero"),
])
def test_layout_rules(changes, field):
    from shoal.layout import Layout
    from shoal.layout_rules import problems
    from shoal.model.config import get_preset as preset

    ok = dict(dp_replicate=2, dp_shard=1, zero=0, micro_batch=2, diloco_inner_steps=5)
    assert problems(Layout(**ok), preset("debug"), 2, 4, 16) == []
    assert problems(Layout(**ok, tp=2), preset("debug"), 4, 4, 16) == []  # tp composes: shards align across groups
    found = problems(Layout(**ok | changes), preset("debug"), 2, 4, 16)
    assert [p.field for p in found] == [field]
