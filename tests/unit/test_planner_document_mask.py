"""Document masks in the planner: the additive mask SDPA keeps per layer, measured on shoal's own model,
and what `shoal plan --document-mask` changes."""

import json

import pytest
import torch

from shoal.layout import Layout
from shoal.model.config import PRESETS
from shoal.model.transformer import Transformer
from shoal.parallel.activation_checkpoint import apply_activation_checkpointing
from shoal.planner.memory import document_mask_bytes
from shoal.planner.workload import Workload
from shoal.train.memory import ActivationMeter

CFG = PRESETS["debug"]
B, T = 2, 128


def _saved_bytes(recompute: str, documents: bool) -> int:
    torch.manual_seed(0)
    model = Transformer(CFG)
    apply_activation_checkpointing(model, recompute)
    tokens = torch.randint(0, CFG.vocab_size, (B, T))
    docs = (torch.arange(T) // 40).expand(B, T) if documents else None  # four packed documents per row
    with ActivationMeter(list(model.parameters())) as meter:
        model(tokens, docs)
    return meter.peak


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_additive_mask_is_kept_per_layer_unless_the_layer_is_recomputed(recompute):
    measured = _saved_bytes(recompute, True) - _saved_bytes(recompute, False)
    workload = Workload(CFG, T, B, precision="fp32", kernels="eager", document_mask=True)
    per_layer, per_microbatch = document_mask_bytes(workload, Layout(micro_batch=B, activation_checkpoint=recompute))
    assert measured == per_layer * CFG.n_layers + per_microbatch
    assert (per_layer > 0) == (recompute == "none")


def test_plan_with_document_masks_is_slower_and_emits_the_mask(tmp_path, capsys):
    from shoal.cli.main import main

    base = ["plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "64", "--gpu", "h100",
            "--gpus", "8", "--dp", "8", "--tp", "1", "--pp", "1", "--zero", "3", "--micro-batch", "1",
            "--activation-checkpoint", "none", "--json"]
    runs = {}
    for flag in ([], ["--document-mask", "--emit", str(tmp_path / "masked.toml")]):
        assert main(base + flag) == 0
        out = json.loads(capsys.readouterr().out)
        runs[bool(flag)] = out["plans"][0], out["workload"]["document_mask"]
    (masked, on), (causal, off) = runs[True], runs[False]
    assert on and not off
    assert masked["time_breakdown_s"]["compute"] > causal["time_breakdown_s"]["compute"]
    # 32 layers x [1, 1, 8192, 8192] bf16 additive masks: 4 GiB more activations
    grew = masked["memory_breakdown_gib"]["activations"] - causal["memory_breakdown_gib"]["activations"]
    assert grew == pytest.approx(32 * 8192 * 8192 * 2 / 2**30, rel=0.01)
    assert "[data]\ndocument_mask = true" in (tmp_path / "masked.toml").read_text()
