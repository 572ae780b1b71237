"""The model: shapes, causality, parameter counts vs analytics, MoE routing, checkpointing modes."""

import pytest
import torch
import torch.nn.functional as F

from shoal.errors import UserError
from shoal.model.analytics import activation_bytes, flops_per_token, param_counts
from shoal.model.config import PRESETS, get_preset
from shoal.model.moe import MoE
from shoal.model.transformer import build_model, cross_entropy
from shoal.parallel.activation_checkpoint import apply_activation_checkpointing


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_count_matches_module(name):
    cfg = PRESETS[name]
    if cfg.is_mla:  # planned, never built as something else (tests/unit/test_planner_mla.py)
        with pytest.raises(UserError, match="latent"):
            build_model(cfg, device="meta")
        return
    model = build_model(cfg, device="meta")
    assert sum(p.numel() for p in model.parameters()) == param_counts(cfg).total


def test_llama3_8b_closed_form():
    # 32 layers x (attention 4096*(4096+1024+1024+4096) + SwiGLU 3*4096*14336 + 2 norms)
    # + embedding and untied head 2*128256*4096 + final norm: the published 8.03B.
    per_layer = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096
    expected = 32 * per_layer + 2 * 128256 * 4096 + 4096
    assert param_counts(get_preset("llama3-8b")).total == expected == 8_030_261_248


def test_mixtral_active_params():
    counts = param_counts(get_preset("mixtral-8x7b"))
    assert round(counts.total / 1e9, 1) == 46.7  # published: 46.7B total
    assert round(counts.active / 1e9, 1) == 12.9  # published: 12.9B active


def test_flops_per_token_convention():
    cfg = get_preset("llama3-8b")
    n = param_counts(cfg).total - cfg.vocab_size * cfg.dim  # embedding lookup excluded, head kept
    assert flops_per_token(cfg, 8192) == 6 * n + 12 * 32 * 4096 * 8192


def test_activation_bytes_scale_with_parallelism():
    cfg = get_preset("llama3-8b")
    base = activation_bytes(cfg, 4096, 1)
    assert activation_bytes(cfg, 4096, 2) == pytest.approx(2 * base)
    tp_sp = activation_bytes(cfg, 4096, 1, tp=8, sequence_parallel=True)
    assert tp_sp == pytest.approx(base / 8)  # with sequence parallelism everything splits
    assert activation_bytes(cfg, 4096, 1, tp=8) > tp_sp  # without it, norm tensors are replicated
    assert activation_bytes(cfg, 4096, 1, recompute="full") < activation_bytes(cfg, 4096, 1, recompute="selective") < base


def test_forward_is_causal():
    model = build_model(get_preset("debug"), seed=0)
    x = torch.randint(0, 256, (2, 32))
    y = x.clone()
    y[:, 20:] = torch.randint(0, 256, (2, 12))
    a, b = model(x), model(y)
    assert a.shape == (2, 32, 256)
    torch.testing.assert_close(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_tied_embeddings_share_storage():
    from shoal.parallel.parallelize import materialize

    model = build_model(get_preset("debug").replace(tie_embeddings=True))
    assert model.output.weight is model.tok_embeddings.weight
    assert sum(p.numel() for p in model.parameters()) == param_counts(model.cfg).total
    # built on the meta device, as every run builds it: to_empty gives each module its own new
    # parameter, and the head trained apart from the embedding (a run's 1-process reference diverged)
    meta = materialize(build_model(model.cfg, device="meta"), torch.device("cpu"), seed=0)
    assert meta.output.weight is meta.tok_embeddings.weight


def test_init_is_seeded():
    a, b = build_model(get_preset("debug"), seed=3), build_model(get_preset("debug"), seed=3)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n


def test_moe_routes_top_k_and_balances():
    torch.manual_seed(0)  # the aux bound below holds for this router, not for every random draw
    cfg = get_preset("debug-moe")
    moe = MoE(cfg)
    torch.nn.init.normal_(moe.router.weight, std=0.02)
    for p in moe.experts.parameters():
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(2, 16, cfg.dim)
    weights, experts, counts, aux = moe.route(x.reshape(-1, cfg.dim))
    assert experts.shape == (32, cfg.top_k) and counts.sum() == 32 * cfg.top_k
    torch.testing.assert_close(weights.sum(-1), torch.ones(32))
    assert aux.item() >= 1.0 - 1e-5  # E * sum f*P is minimized (=1) by a perfectly uniform router


def test_moe_matches_dense_loop():
    """The sorted/grouped expert computation equals a per-token loop over its top-k experts."""
    torch.manual_seed(0)
    cfg = get_preset("debug-moe").replace(n_shared_experts=0)
    moe = MoE(cfg)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(1, 10, cfg.dim)
    got = moe(x)[0]
    weights, experts, _, _ = moe.route(x[0])
    w1, w2, w3 = moe.experts.w1, moe.experts.w2, moe.experts.w3
    for t in range(10):
        want = sum(weights[t, k] * ((torch.nn.functional.silu(x[0, t] @ w1[e]) * (x[0, t] @ w3[e])) @ w2[e])
                   for k, e in enumerate(experts[t].tolist()))
        torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-5)


def test_moe_aux_loss_reaches_router():
    cfg = get_preset("debug-moe").replace(aux_loss_coef=1.0)
    model = build_model(cfg, seed=0)
    x = torch.randint(0, 256, (2, 16))
    # Only the aux loss: zero the main loss' gradient by multiplying the output by 0.
    (model(x) * 0).sum().backward()
    router = next(m for m in model.modules() if isinstance(m, MoE)).router
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_float64_is_not_rounded_to_fp32():
    """`shoal verify` computes in float64 (shoal/train/parity.py). The norms, rotary embeddings, router
    and loss upcast bf16 to fp32; a float64 input must keep its precision there, or fp32's rounding
    (1e-8 here) comes back and training amplifies it past verify's tolerance."""
    from shoal.model.precision import upcast
    from shoal.model.rope import apply_rope, rope_tables
    from shoal.model.transformer import RMSNorm
    from shoal.train.parity import config_for, in_float64

    with in_float64(config_for("train.precision=bf16", 1, 1)):  # bf16 runs as it trains
        assert torch.get_default_dtype() == torch.float32
    with in_float64(config_for(None, 1, 1)):
        model = build_model(get_preset("debug-moe"), seed=0)
    assert torch.get_default_dtype() == torch.float32 and {p.dtype for p in model.parameters()} == {torch.float64}

    torch.manual_seed(0)
    x_BTHE = torch.randn(2, 8, 4, 16, dtype=torch.float64)
    norm = RMSNorm(16, eps=1e-5).double()
    exact = x_BTHE * torch.rsqrt(x_BTHE.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x_BTHE), exact, rtol=0, atol=1e-14)
    rope = rope_tables(get_preset("debug").replace(max_seq_len=8))  # head size 16
    cos, sin = rope[0, :, None, :].double(), rope[1, :, None, :].double()
    x1, x2 = x_BTHE.chunk(2, dim=-1)
    torch.testing.assert_close(apply_rope(x_BTHE, rope), torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1),
                               rtol=0, atol=1e-14)
    logits_BTV, targets_BT = torch.randn(2, 8, 256, dtype=torch.float64), torch.randint(0, 256, (2, 8))
    assert cross_entropy(logits_BTV, targets_BT).item() == F.cross_entropy(logits_BTV.flatten(0, 1),
                                                                            targets_BT.flatten()).item()
    moe = next(m for m in model.modules() if isinstance(m, MoE))
    h_ND = torch.randn(16, model.cfg.dim, dtype=torch.float64)
    weights_NK, experts_NK, _, aux = moe.route(h_ND)
    probs_NE = torch.softmax(moe.router(h_ND), -1)
    torch.testing.assert_close(weights_NK, probs_NE.gather(1, experts_NK) / probs_NE.gather(1, experts_NK).sum(-1, True),
                               rtol=0, atol=1e-15)
    assert aux.dtype == torch.float64
    assert upcast(torch.ones(1, dtype=torch.bfloat16)).dtype == torch.float32  # bf16 still computes these in fp32


@pytest.mark.parametrize("mode", ["selective", "selective-op", "full"])
def test_activation_checkpointing_keeps_loss_and_grads(mode):
    x = torch.randint(0, 256, (2, 33))
    grads = {}
    for m in ("none", mode):
        model = build_model(get_preset("debug"), seed=0)
        apply_activation_checkpointing(model, m)
        loss = cross_entropy(model(x[:, :-1]), x[:, 1:])
        loss.backward()
        grads[m] = (loss.detach(), {n.replace("._checkpoint_wrapped_module", ""): p.grad
                                    for n, p in model.named_parameters()})
        assert "_checkpoint_wrapped_module" not in "".join(model.state_dict())  # checkpoints keep plain names
    torch.testing.assert_close(grads["none"][0], grads[mode][0], rtol=0, atol=0)
    assert grads["none"][1].keys() == grads[mode][1].keys()
    for name, g in grads["none"][1].items():
        torch.testing.assert_close(g, grads[mode][1][name], rtol=1e-6, atol=1e-7)


def test_each_checkpointing_mode_recomputes_its_matmuls():
    """Backward runs each block's forward matmuls again as the mode says: none under selective, every
    second one (wk, wo, w3 of seven) under selective-op, and under full all but w2, the last, whose
    output backward does not need (non-reentrant checkpointing stops recomputing once it has all it needs)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMatmuls(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, op, types, args=(), kwargs=None):
            CountMatmuls.count += op == torch.ops.aten.mm.default
            return op(*args, **(kwargs or {}))

    cfg = get_preset("debug")
    x = torch.randint(0, 256, (2, 17))
    in_backward = {}
    for mode in ("none", "selective", "selective-op", "full"):
        model = build_model(cfg, seed=0)
        apply_activation_checkpointing(model, mode)
        loss = cross_entropy(model(x[:, :-1]), x[:, 1:])
        CountMatmuls.count = 0
        with CountMatmuls():
            loss.backward()
        in_backward[mode] = CountMatmuls.count
    recomputed = {mode: (n - in_backward["none"]) / cfg.n_layers for mode, n in in_backward.items()}
    assert recomputed == {"none": 0, "selective": 0, "selective-op": 3, "full": 6}


def test_a_stage_materialized_from_meta_gets_the_whole_models_values():
    """What lets every rank build on the meta device: each parameter's values depend only on the
    seed and its name, not on what else was built."""
    from shoal.parallel.parallelize import materialize
    from shoal.parallel.pipeline import cut_stage

    cfg = get_preset("debug-moe")
    whole = dict(build_model(cfg, seed=3).named_parameters())
    stage = materialize(cut_stage(build_model(cfg, device="meta"), 1, 2, range(2, 4)), torch.device("cpu"), seed=3)
    names = [n for n, _ in stage.named_parameters()]
    assert names and all(n.startswith(("layers.2.", "layers.3.", "norm.", "output.")) for n in names)
    for name, p in stage.named_parameters():
        assert torch.equal(p, whole[name]), name
    assert not torch.equal(dict(build_model(cfg, seed=4).named_parameters())["output.weight"], whole["output.weight"])


@pytest.mark.parametrize("window", [0, 5])
def test_packed_documents_lose_what_they_lose_alone(window):
    """With document masks, the loss summed over a packed sequence is the sum of each document's loss
    run on its own: attention never crosses an eos, and positions restart at each one."""
    cfg = get_preset("tiny").replace(n_layers=2, sliding_window=window)
    model = build_model(cfg).double()
    eos = 0
    docs = [[eos, 5, 9, 3], [eos, 7, 7, 2, 8, 1, 4, 6], [eos, 3], [eos, 9, 9, 9, 5, 2]]
    packed = torch.tensor([sum(docs, [])])
    inputs, targets = packed[:, :-1], packed[:, 1:]
    documents = torch.cumsum(inputs == eos, dim=1)  # what the loader gives (shoal/data/loader.py)
    logits = model(inputs, documents)
    total = F.cross_entropy(logits[0], targets[0], reduction="sum")
    # each document alone predicts its tokens and the eos that opens the next (the last has none here)
    alone = 0.0
    for i, doc in enumerate(docs):
        ids = torch.tensor([doc + ([eos] if i < len(docs) - 1 else [])])
        alone = alone + F.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:], reduction="sum")
    assert torch.allclose(total, alone, rtol=1e-12)
    assert not torch.allclose(F.cross_entropy(model(inputs)[0], targets[0], reduction="sum"), alone, rtol=1e-3)


@pytest.mark.parametrize("name,total,active", [
    ("llama2-7b", 6.74e9, None), ("llama2-70b", 68.98e9, None), ("mistral-7b", 7.25e9, None),
    ("qwen2.5-72b", 72.7e9, None), ("qwen3-32b", 32.8e9, None),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9), ("qwen3-235b-a22b", 235e9, 22e9), ("gpt-oss-120b", 116.8e9, None),
])
def test_open_model_presets_have_their_published_sizes(name, total, active):
    # the model cards' counts (Qwen3's "30.5B / 3.3B activated", "235B / 22B"; gpt-oss's 116.8B)
    counts = param_counts(get_preset(name))
    assert counts.total == pytest.approx(total, rel=0.01)
    if active:
        assert counts.active == pytest.approx(active, rel=0.02)
