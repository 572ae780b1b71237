"""Fast paths chosen by device (shoal/model/kernels.py, optim.adamw_kernel, debug.memory_snapshot) and
train.compile's per-block application: what CPU can check. Their CUDA side runs in tests/cuda."""

import torch
from torch.nn.attention import SDPBackend

from shoal.config import load_config
from shoal.debug.memory_snapshot import MemorySnapshot
from shoal.model.config import get_preset
from shoal.model.kernels import attention_backend, attention_backends
from shoal.model.transformer import build_model
from shoal.parallel.compile import apply_compile
from shoal.train.optim import adamw_kernel, build_optimizer


def test_attention_backends_by_device():
    assert attention_backends("cuda", (9, 0))[0] == SDPBackend.CUDNN_ATTENTION  # H100: cuDNN first
    assert attention_backends("cuda", (8, 0))[0] == SDPBackend.FLASH_ATTENTION  # A100: FlashAttention-2
    for order in (attention_backends("cuda", (9, 0)), attention_backends("cuda", (8, 0))):
        assert SDPBackend.FLASH_ATTENTION in order and order[-1] == SDPBackend.MATH  # math only as a fallback
    assert attention_backends("cpu") == [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def test_attention_backend_names_the_cpu_kernel():
    cfg = get_preset("debug")
    for dtype in (torch.float32, torch.bfloat16):
        name = attention_backend(cfg.n_heads, cfg.n_kv_heads, cfg.head_size, 64, torch.device("cpu"), dtype)
        assert name == "flash (cpu kernel)", name


def test_fused_adamw_only_when_every_parameter_is_on_cuda():
    not_cuda = [torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2, device="meta"))]
    assert adamw_kernel(not_cuda) == {"foreach": False}
    assert adamw_kernel([]) == {"foreach": False}
    opt = build_optimizer(torch.nn.Linear(2, 2, device="meta"), load_config(None, []).train)
    assert all(not g["fused"] and g["foreach"] is False for g in opt.param_groups)


def test_memory_snapshot_is_a_warned_no_op_on_cpu(tmp_path, capsys):
    snap = MemorySnapshot(True, torch.device("cpu"), tmp_path)
    assert "debug.memory_snapshot=true is ignored on cpu" in capsys.readouterr().err
    assert snap.dump() is None and not list(tmp_path.iterdir())
    MemorySnapshot(False, torch.device("cpu"), tmp_path)  # off: silent
    assert capsys.readouterr().err == ""


def test_config_fields():
    cfg = load_config(None, ["train.compile=true", "debug.memory_snapshot=true"])
    assert cfg.train.compile is True and cfg.debug.memory_snapshot is True
    assert load_config(None, []).train.compile is False


def test_compile_wraps_each_block_in_place_and_keeps_names():
    """Compilation is lazy: this checks where it is applied (per block, or per sublayer under TP),
    not its numerics (tests/dist/test_parity.py trains compiled against eager)."""
    cfg = get_preset("debug")
    plain = list(build_model(cfg, "meta").state_dict())
    model = build_model(cfg, "meta")
    apply_compile(model, False)
    assert all(b._compiled_call_impl is None for b in model.layers.values())
    apply_compile(model, True)
    assert all(b._compiled_call_impl is not None for b in model.layers.values())
    assert list(model.state_dict()) == plain  # checkpoints and HF export see the plain model's names
    tp = build_model(cfg, "meta")
    apply_compile(tp, True, tensor_parallel=True)
    for b in tp.layers.values():
        assert b._compiled_call_impl is None
        assert b.attention._compiled_call_impl is not None and b.feed_forward._compiled_call_impl is not None


def test_compile_refuses_the_zero_bubble_schedule():
    """zero-bubble splits a block's backward in two passes; a compiled block cannot be split (verify failed)."""
    import pytest

    from shoal.errors import UserError

    with pytest.raises(UserError, match="train.compile"):
        load_config(None, ["train.compile=true", "parallel.pp=2", "parallel.pp_schedule=zero-bubble"])
    load_config(None, ["train.compile=true", "parallel.pp=2", "parallel.pp_schedule=interleaved-1f1b"])


def test_compile_on_cpu_without_a_cxx_compiler_is_a_user_error(monkeypatch):
    import pytest

    from shoal.errors import UserError

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(UserError, match=r"C\+\+ compiler"):
        apply_compile(build_model(get_preset("debug"), "meta"), True, device_type="cpu")
    apply_compile(build_model(get_preset("debug"), "meta"), True, device_type="cuda")  # Triton, no C++ needed
