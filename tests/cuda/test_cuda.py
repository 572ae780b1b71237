"""The CUDA and NCCL paths, on one GPU: `pytest -m cuda` (skipped where torch sees no GPU).

A world of 1 exercises NCCL's paths (process group, watchdog, collective checker), not the
multi-rank mismatch cases, which stay on gloo in tests/dist.
"""

import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from shoal.rundir.metrics import read_rows

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]

BASE = ["model.preset=debug", "train.micro_batch=4", "train.global_batch=8", "train.seq_len=64",
        "train.warmup_steps=2", "train.eval_every=0", "train.eval_batches=1", "train.sample_tokens=0"]


def run(out, *overrides, resume="auto"):
    from shoal.config import load_config
    from shoal.train.trainer import train

    return train(load_config(None, BASE + list(overrides)), out, show=False, resume=resume)


def losses(out):
    return [r["loss"] for r in read_rows(out)]


def test_model_forward_backward_in_bf16():
    from shoal.model.config import get_preset
    from shoal.model.transformer import build_model, cross_entropy

    cfg = get_preset("debug")
    tokens = torch.randint(0, cfg.vocab_size, (4, 65), generator=torch.Generator().manual_seed(0))
    ref = cross_entropy(build_model(cfg, "cpu", seed=0)(tokens[:, :-1]), tokens[:, 1:])
    model = build_model(cfg, "cuda", seed=0)
    x, y = tokens.cuda(), tokens.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = cross_entropy(model(x[:, :-1]), y[:, 1:])
    loss.backward()
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 2e-2, (loss.item(), ref.item())
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.isfinite().all()
               for p in model.parameters())


def test_fast_paths_are_chosen_on_cuda():
    from shoal.model.config import get_preset
    from shoal.model.kernels import attention_backend
    from shoal.train.optim import adamw_kernel

    assert adamw_kernel([torch.nn.Parameter(torch.zeros(2, device="cuda"))]) == {"fused": True}
    cfg = get_preset("llama3-8b")
    name = attention_backend(cfg.n_heads, cfg.n_kv_heads, cfg.head_size, 4096, torch.device("cuda"), torch.bfloat16)
    assert not name.startswith("math"), name  # a fused kernel for Llama's GQA in bf16


def test_train_bf16_checkpoint_resume_and_memory_snapshot(tmp_path):
    full = tmp_path / "full"
    # Two async saves (steps 3 and 6) stage device state into pinned host memory twice.
    summary = run(full, "train.steps=6", "train.precision=bf16", "checkpoint.every=3", "checkpoint.async=true",
                  "debug.memory_snapshot=true")
    assert summary["attention"].endswith("(cuda)") and not summary["attention"].startswith("math")
    assert (full / "memory_snapshot_rank0.pickle").stat().st_size > 0
    short = tmp_path / "short"
    run(short, "train.steps=3", "train.precision=bf16", "checkpoint.every=3")
    resumed = run(short, "train.steps=6", "train.precision=bf16", "checkpoint.every=3")
    assert resumed["steps"] == 6 and len(losses(short)) == 6
    # Same step-by-step losses as the uninterrupted run (CUDA kernels may differ in the last bits), and
    # the async run committed its second save.
    assert (full / "checkpoints" / "step_00000006").is_dir(), sorted(p.name for p in full.rglob("step_*"))
    assert losses(short) == pytest.approx(losses(full), abs=1e-3)


def test_compile_matches_eager_on_cuda(tmp_path):
    run(tmp_path / "eager", "train.steps=4")
    run(tmp_path / "compiled", "train.steps=4", "train.compile=true")
    eager, compiled = losses(tmp_path / "eager"), losses(tmp_path / "compiled")
    assert compiled == pytest.approx(eager, abs=1e-4), (compiled, eager)



@pytest.mark.parametrize("setting", ["train.precision=fp16", "train.precision=fp8", "train.activation_offload=true",
                                     "data.document_mask=true"])
def test_precisions_offload_and_document_masks_on_cuda(tmp_path, setting):
    """The CUDA side of what runs emulated or on CPU in tests/unit and tests/dist: each setting trains finite
    steps, and offloaded activations (pinned host memory on CUDA) give the plain run's losses."""
    if setting.endswith("fp8"):
        pytest.importorskip("torchao")
        if torch.cuda.get_device_capability() < (8, 9):
            pytest.skip("FP8 matmuls need sm89 or newer")
    corpus = []
    if setting.startswith("data."):  # short documents, so the mask has boundaries inside each sequence
        docs = tmp_path / "docs.jsonl"
        docs.write_text("".join(f'{{"text": "Note {i}: {"abc " * (i % 9)}"}}\n' for i in range(400)))
        corpus = [f"data.path={docs}", f"data.cache_dir={tmp_path / 'cache'}"]
    run(tmp_path / "run", "train.steps=4", setting, *corpus)
    got = losses(tmp_path / "run")
    assert len(got) == 4 and all(x == x and abs(x) < 1e4 for x in got), got
    if "offload" in setting:
        run(tmp_path / "plain", "train.steps=4")
        assert got == pytest.approx(losses(tmp_path / "plain"), abs=1e-5)


WATCHED = r'''
import sys, time
import torch, torch.distributed as dist
import shoal.debug
shoal.debug.enable(check_collectives=True, hang_timeout_s=float(sys.argv[1]))
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(8, device="cuda")
for step in range(4):
    shoal.debug.progress(step, "forward")
    dist.all_reduce(x)
torch.cuda.synchronize()
print("SUM", float(x[0]), flush=True)
if sys.argv[2] == "sleep":
    time.sleep(1000)  # no progress: the watchdog reports and ends the job
dist.destroy_process_group()
'''


@pytest.mark.parametrize("fault", ["none", "sleep"])
def test_watchdog_and_checker_on_nccl_world_of_one(tmp_path, fault):
    script = tmp_path / "job.py"
    script.write_text(WATCHED)
    env = dict(os.environ, PYTHONUNBUFFERED="1", SHOAL_DEBUG_DIR=str(tmp_path / "debug"))
    r = subprocess.run([sys.executable, "-m", "shoal", "run", "--nproc", "1", str(script), "3", fault], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "SUM 1.0" in out, out[-4000:]  # world of 1: all_reduce leaves the value
    if fault == "none":
        assert r.returncode == 0 and "hang report" not in out, out[-4000:]
    else:
        assert r.returncode != 0 and "shoal hang report" in out, out[-4000:]
