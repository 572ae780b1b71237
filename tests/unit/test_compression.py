"""Gradient compressors on their own (a gloo world of one, in process) and their config rules.

The two-rank equivalences (degenerate settings == plain DDP, resume == uninterrupted, the dtype on
the wire) are in tests/dist/test_compression_two_ranks.py, and under FSDP2 in test_compression_fsdp.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from shoal.config import load_config
from shoal.errors import UserError
from shoal.job import resolve
from shoal.layout import TrainerLimit
from shoal.parallel import compression


@pytest.fixture()
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _cfg(**kw):
    return SimpleNamespace(**({"topk_density": 0.1, "topk_warmup": 0, "powersgd_rank": 2, "powersgd_warmup": 0} | kw))


def test_topk_error_feedback_identity(world_of_one):
    """g + e_old = C(g + e_old) + e_new, step after step, and C keeps exactly k values."""
    model = nn.Linear(16, 8)
    c = compression.TopK(model, world_of_one, _cfg(topk_density=0.25), seed=0)
    segments = [(name, p.shape) for name, p in model.named_parameters()]
    n = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        g = torch.randn(n, generator=gen)
        e_old = torch.cat([c.error[name].view(-1) for name in ("weight", "bias")]) if c.error else torch.zeros(n)
        sent = c.reduce(g.clone(), segments)
        e_new = torch.cat([c.error[name].view(-1) for name in ("weight", "bias")])
        assert int((sent != 0).sum()) == -(-n // 4)
        torch.testing.assert_close(sent + e_new, g + e_old, rtol=0, atol=1e-6)


def test_topk_error_feedback_follows_each_parameter_through_ddp_bucket_rebuild(world_of_one):
    """DDP regroups its buckets after the first step (here: 1 bucket, then 3). Per parameter, what
    it sent plus its new error is its gradient plus its old error, before and after the rebuild."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 50))
    c = compression.TopK(model, world_of_one, _cfg(topk_density=0.3), seed=0)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.002, gradient_as_bucket_view=True)
    ddp.register_comm_hook(c, compression.TopK.hook)
    reduce, got, buckets = c.reduce, {}, []

    def spy(flat, segments):  # the local gradient each parameter brought, by name
        got.update((n, g.clone()) for (n, _), g in zip(segments, flat.split([s.numel() for _, s in segments])))
        buckets[-1] += 1
        return reduce(flat, segments)

    c.reduce = spy
    for _ in range(3):
        e_old, buckets = {n: e.clone() for n, e in c.error.items()}, buckets + [0]
        ddp(torch.randint(0, 50, (4, 8))).sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad.view(-1) + c.error[name], got[name] + e_old.get(name, 0), rtol=0, atol=1e-6)
        model.zero_grad(set_to_none=False)
    assert buckets == [1, 3, 3]


def test_topk_warmup_steps_are_plain_then_it_sparsifies(world_of_one):
    """topk_warmup=2: steps 1-2 pass the gradient through whole (a plain mean; no error kept), step 3
    sends k values and keeps the rest as error."""
    model = nn.Linear(16, 8)
    c = compression.TopK(model, world_of_one, _cfg(topk_density=0.25, topk_warmup=2), seed=0)
    gen = torch.Generator().manual_seed(3)
    for step in range(3):
        g = torch.randn(16 * 8, generator=gen)
        flat = g.clone()
        c.hook(c, _Bucket(flat, [model.weight]))
        if step < 2:
            assert torch.equal(flat, g) and not c.error
        else:
            assert int((flat != 0).sum()) == 32 and c.error["weight"].count_nonzero() == 96


def test_powersgd_is_exact_on_a_rank_deficient_matrix(world_of_one):
    """Rank 3 >= the gradient's rank 2, over 10 steps with a warm-started Q: P Q^T == M, error 0."""
    model = nn.Linear(48, 64, bias=False)
    c = compression.PowerSGD(model, world_of_one, _cfg(powersgd_rank=3, powersgd_warmup=2), seed=0)
    gen = torch.Generator().manual_seed(1)
    for step in range(10):
        m = torch.randn(64, 2, generator=gen) @ torch.randn(2, 48, generator=gen)
        flat = m.reshape(-1).clone()
        c.hook(c, _Bucket(flat, [model.weight]))
        # fp32 rounding only (~1e-7 a step, which error feedback carries along; 0 with exact arithmetic)
        assert float((flat.view(64, 48) - m).norm() / m.norm()) < 1e-5
        if step >= 2:  # past the warm-up it really compressed: state exists and is ~0
            assert c.error["weight"].norm() < 1e-5 * m.norm() and c.q["weight"].shape == (48, 3)


def test_powersgd_recovers_from_a_q_that_lost_rank(world_of_one):
    """A rank-1 gradient, then a rank-3 one: the warm-started Q (rank 1) is refilled, not kept."""
    model = nn.Linear(32, 40, bias=False)
    c = compression.PowerSGD(model, world_of_one, _cfg(powersgd_rank=3), seed=0)
    gen = torch.Generator().manual_seed(2)
    for r in (1, 3):
        m = torch.randn(40, r, generator=gen) @ torch.randn(r, 32, generator=gen)
        flat = m.reshape(-1).clone()
        c.hook(c, _Bucket(flat, [model.weight]))
        assert float((flat.view(40, 32) - m).norm() / m.norm()) < 1e-5


def test_int8_round_trip_is_within_half_a_step_per_chunk():
    x = torch.randn(4 * compression.CHUNK) * torch.linspace(0.01, 100, 4 * compression.CHUNK)
    q, scale = compression.quantize(x)
    assert q.dtype == torch.int8 and scale.numel() == 4
    err = (compression.dequantize(q, scale) - x).view(-1, compression.CHUNK).abs().amax(1)
    assert bool((err <= scale / 2 * (1 + 1e-6)).all())


def test_fp4_keeps_sign_and_nearest_power_of_two_in_half_a_byte():
    """Each magnitude to the nearer (in value) of the powers of two around it, within a third; below
    half of 1/64 of the chunk's largest, zero; the largest itself exact; two values to a byte."""
    C = compression.CHUNK
    x = torch.randn(4 * C) * torch.logspace(-4, 2, 4 * C)
    q, scale = compression.quantize_fp4(x)
    assert q.dtype == torch.uint8 and q.numel() == 2 * C and torch.equal(scale, x.view(4, C).abs().amax(1))
    y = compression.dequantize_fp4(q, scale)
    r = (x.abs() / scale.repeat_interleave(C))
    kept = r >= 2.0 ** -7
    assert bool((y[~kept] == 0).all()) and bool((torch.sign(y[kept]) == torch.sign(x[kept])).all())
    ratio = (y.abs() / x.abs())[r >= 2.0 ** -6]  # 1.5 * 2^k goes to 2^k or 2^(k+1): a third off at most
    assert bool((ratio >= 2 / 3 - 1e-6).all()) and bool((ratio <= 4 / 3 + 1e-6).all())
    powers = torch.log2(y[kept].abs() / scale.repeat_interleave(C)[kept])
    assert torch.equal(powers, powers.round()) and powers.min() >= -6
    top = x.view(4, C).abs().argmax(1) + torch.arange(4) * C
    assert torch.equal(y[top], x[top])
    band = kept & (r < 2.0 ** -6)  # between half the smallest power and the smallest: the smallest
    assert band.any() and torch.equal(y[band], torch.sign(x[band]) * scale.repeat_interleave(C)[band] / 64)


def test_int8_with_one_rank_only_quantizes(world_of_one):
    model = nn.Linear(30, 30)
    c = compression.Int8(model, world_of_one, _cfg(), seed=0)
    g = torch.randn(30 * 31)
    out = c.reduce(g.clone(), [(name, p.shape) for name, p in model.named_parameters()])
    assert (out - g).abs().max() <= g.abs().max() / 127  # twice quantized, each within half a step


class _Bucket:
    def __init__(self, flat, params):
        self.flat, self.params = flat, params

    def buffer(self):
        return self.flat

    def parameters(self):
        return self.params

    def is_last(self):
        return True


BASE = ["model.preset=debug", "train.global_batch=4", "parallel.dp_replicate=2", "parallel.dp_shard=1",
        "parallel.zero=0"]


@pytest.mark.parametrize("setting,field", [
    ("parallel.topk_density=0", "parallel.topk_density"),
    ("parallel.topk_density=1.5", "parallel.topk_density"),
    ("parallel.powersgd_rank=0", "parallel.powersgd_rank"),
    ("parallel.grad_compression=fp8", "parallel.grad_compression"),
])
def test_bad_settings_name_their_field(setting, field):
    with pytest.raises(UserError) as e:
        resolve(load_config(None, BASE + ["parallel.grad_compression=topk", setting]), 2)
    assert e.value.field == field


def test_compression_needs_a_data_parallel_dimension():
    with pytest.raises(UserError) as e:
        resolve(load_config(None, ["model.preset=debug", "parallel.grad_compression=bf16", "parallel.tp=2",
                                   "parallel.dp_shard=1"]), 2)
    assert e.value.field == "parallel.grad_compression" and "dp_replicate*dp_shard=1" in e.value.fix


def test_which_fsdp_layouts_each_method_runs_on():
    """FSDP2 zero=2/3: int8 everywhere (it compresses the reduce-scatter too); topk and powersgd only
    with dp_replicate > 1 (HSDP's all-reduce is what they compress); none of the three with tp."""
    def layout(method, *sets, world=2):
        base = ["model.preset=debug", "train.global_batch=4", "parallel.dp_shard=2", "parallel.zero=3"]
        return resolve(load_config(None, base + list(sets) + [f"parallel.grad_compression={method}"]), world).layout

    assert layout("int8").grad_compression == "int8" and layout("bf16").grad_compression == "bf16"
    with pytest.raises(TrainerLimit) as e:
        layout("topk")
    assert "dp_replicate" in e.value.fix
    assert layout("powersgd", "parallel.dp_replicate=2", world=4).dp_replicate == 2
    with pytest.raises(TrainerLimit) as e:
        layout("int8", "parallel.tp=2", world=4)
    assert "grad_compression=bf16" in e.value.fix
    # zero=1 and zero=0 run on DDP: every method is allowed there
    for zero in (0, 1):
        layout("powersgd", f"parallel.zero={zero}")
