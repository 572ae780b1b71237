"""Per-rank memory: the activation meter against exact byte counts, and when rows carry it."""

import torch

from shoal.train.memory import ActivationMeter, RankMemory, StateBytes, model_state


def test_activation_meter_counts_what_autograd_keeps_once_per_storage():
    x = torch.randn(1000, requires_grad=True)  # an input, not a parameter: its storage counts
    w = torch.nn.Parameter(torch.randn(1000))
    with ActivationMeter([w]) as meter:
        a = x.exp()  # saves its output a: 4000 bytes
        b = a.sin()  # saves a again: the same storage, counted once
        c = b.pow(2)  # saves b: 4000 more
        d = (c * w).sum()  # saves c (4000) and w (a parameter: model state, not counted)
        x_view = x[:500]  # a view saves nothing new when multiplied by a constant
        e = (x_view * 2.0).sum()
    assert meter.peak == 3 * 4000
    del a, b, c
    (d + e).backward()
    # freed with the graph: nothing counted stays live (x itself was never saved by an op here)
    assert meter.current == 0


def test_activation_meter_sees_interleaved_microbatches():
    w = torch.nn.Parameter(torch.randn(256, 256))
    with ActivationMeter([w]) as meter:
        first = (torch.randn(8, 256) @ w).relu().sum()  # saves the input (8 KiB) and relu's output (8 KiB)
        second = (torch.randn(8, 256) @ w).relu().sum()  # a second micro-batch in flight: twice that
        first.backward()
        peak_both = meter.peak
        second.backward()
    assert peak_both == 2 * 2 * 8 * 256 * 4
    assert meter.current == 0


def test_model_state_splits_params_grads_and_optimizer():
    model = torch.nn.Linear(16, 8)  # 136 parameters
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    s = model_state(model.parameters(), opt)
    assert (s.params, s.grads, s.optimizer) == (136 * 4, 136 * 4, 2 * 136 * 4)  # AdamW: exp_avg, exp_avg_sq
    assert s.total == 4 * 136 * 4


def test_rows_carry_every_ranks_memory_only_when_it_moved():
    memory = RankMemory([], torch.device("cpu"), measure_activations=False)
    first = {"peak": [100_000_000, 100_000_000], "activations": [None, None]}
    assert memory.row_fields(first) == {"memory_by_rank": first}
    assert memory.row_fields({"peak": [100_500_000, 100_000_000], "activations": [None, None]}) == {}  # +0.5%
    moved = {"peak": [100_000_000, 102_000_000], "activations": [None, None]}  # +2% on rank 1
    assert memory.row_fields(moved) == {"memory_by_rank": moved}
    measured = {"peak": [100_000_000, 102_000_000], "activations": [5, 5]}
    assert memory.row_fields(measured) == {"memory_by_rank": measured}
    assert memory.kinds(StateBytes(1, 2, 3))["activations"] != memory.kinds(StateBytes(1, 2, 3))["activations"]  # NaN
