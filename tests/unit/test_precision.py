"""fp16's loss scaler, fp8's emulated linear layers and activation offload, in one process on the
`debug` model (the 2-rank checks, FSDP and pipeline, are tests/dist/test_precision_dist.py)."""

import math

import pytest
import torch

from shoal.config import load_config
from shoal.rundir.metrics import read_rows
from shoal.rundir.names import step_dir_name
from shoal.train.loss_scale import LossScaler

BASE = ["model.preset=debug", "train.global_batch=4", "train.seq_len=64", "train.eval_every=0", "train.eval_batches=1",
        "train.sample_tokens=0", "train.warmup_steps=2", "train.lr=1e-3"]


def run(out, *extra, steps=4, resume="never"):
    from shoal.train.trainer import train

    train(load_config(None, [*BASE, f"train.steps={steps}", *extra]), out, show=False, resume=resume)
    return read_rows(out)


def test_scaler_unscales_halves_on_overflow_and_doubles_after_a_window():
    scaler = LossScaler(init=1024.0, window=2)
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([1024.0, -2048.0, 512.0])
    assert scaler.unscale([p], step=1) and p.grad.tolist() == [1.0, -2.0, 0.5]  # a power of two: exact
    scaler.update(True)
    p.grad = torch.tensor([math.inf, 0.0, 0.0])
    assert not scaler.unscale([p], step=2)
    scaler.update(False)
    assert (scaler.scale, scaler.skipped, scaler.good) == (512.0, 1, 0)
    for _ in range(2):
        scaler.update(True)
    assert scaler.scale == 1024.0 and scaler.metrics() == {"loss_scale": 1024.0, "skipped_steps": 1}
    again = LossScaler()
    again.load_state_dict(scaler.state_dict())
    assert again.state_dict() == scaler.state_dict()
    forced = LossScaler(init=2.0, force_overflow=(3, 4))
    p.grad = torch.ones(3)
    assert forced.unscale([p], step=2) and not forced.unscale([p], step=3)


@pytest.mark.timeout(120)
def test_fp16_skips_forced_overflows_goes_on_and_resumes_bitwise(tmp_path):
    sets = ["train.precision=fp16", "debug.overflow_steps=2", "checkpoint.every=2"]
    rows = run(tmp_path / "full", *sets)
    assert [r["skipped_steps"] for r in rows] == [0, 1, 1, 1]
    assert [r["loss_scale"] for r in rows] == [65536.0, 32768.0, 32768.0, 32768.0]
    assert math.isinf(rows[1]["grad_norm"]) and all(math.isfinite(r["loss"]) for r in rows)
    assert rows[3]["loss"] < rows[0]["loss"]  # it trained on after the skip
    # From step 2's checkpoint: the scale and the skip count come back, and so do the losses, bit for bit.
    resumed = run(tmp_path / "resumed", *sets, resume=str(tmp_path / "full" / "checkpoints" / step_dir_name(2)))
    assert [(r["step"], r["loss"], r["grad_norm"], r["loss_scale"], r["skipped_steps"]) for r in resumed] == \
           [(r["step"], r["loss"], r["grad_norm"], r["loss_scale"], r["skipped_steps"]) for r in rows[2:]]


def test_fp8_swaps_the_blocks_linear_layers_and_stays_close_to_bf16():
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    from shoal.model.transformer import build_model
    from shoal.parallel.float8 import apply_float8

    cfg = load_config(None, BASE).model_config()
    torch.manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 64))
    outs = {}
    for recipe in (None, "tensorwise", "rowwise"):
        model = build_model(cfg, device="meta")
        if recipe:
            assert apply_float8(model, recipe, torch.device("cpu")) == 7 * cfg.n_layers  # wq wk wv wo w1 w2 w3
            assert type(model.output) is torch.nn.Linear and isinstance(model.layers["0"].attention.wq, Float8Linear)
        model.to_empty(device="cpu")
        model.init_weights(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
        logits.float().square().mean().backward()
        outs[recipe] = logits.float(), model.layers["0"].feed_forward.w1.weight.grad.clone()
    ref, ref_grad = outs[None]
    for recipe in ("tensorwise", "rowwise"):
        got, grad = outs[recipe]
        # e4m3 keeps 3 mantissa bits; summed over 64-256 products the error averages down to a few percent
        assert (got - ref).norm() / ref.norm() < 0.05, recipe
        assert (grad - ref_grad).norm() / ref_grad.norm() < 0.1, recipe
        assert not torch.equal(got, ref)  # it did multiply in fp8


@pytest.mark.timeout(120)
def test_activation_offload_changes_nothing(tmp_path):
    plain = run(tmp_path / "plain", steps=3)
    offloaded = run(tmp_path / "offloaded", "train.activation_offload=true", steps=3)
    assert [(r["loss"], r["grad_norm"]) for r in plain] == [(r["loss"], r["grad_norm"]) for r in offloaded]


def test_a_recipe_setting_without_its_precision_is_named():
    from shoal.setting_rules import ignored_settings

    given = {"train.precision": "bf16", "train.fp8_recipe": "rowwise", "train.loss_scale": 1024.0}
    lines = ignored_settings(given, {"train.fp8_recipe": "tensorwise", "train.loss_scale": 65536.0})
    assert len(lines) == 2 and "train.precision=fp8" in lines[0] and "train.precision=fp16" in lines[1]
    assert not ignored_settings({**given, "train.precision": "fp8"}, {"train.loss_scale": 1024.0})
