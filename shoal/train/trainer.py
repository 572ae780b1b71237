"""The training loop. Setup is build_* functions; `train` only orchestrates and fits on a screen."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from shoal.config import JobConfig
from shoal.data.loader import TokenLoader, eval_batches
from shoal.data.shards import build_token_cache
from shoal.data.tokenizer import load_tokenizer
from shoal.errors import UserError
from shoal.model.analytics import flops_per_token, param_counts
from shoal.model.config import ModelConfig
from shoal.model.moe import AuxLossInjector
from shoal.model.transformer import Transformer, build_model, cross_entropy
from shoal.parallel.activation_checkpoint import apply_activation_checkpointing
from shoal.train.metrics import MetricsLog, Progress, peak_mem_bytes, print_summary
from shoal.train.optim import build_optimizer, lr_at, set_lr
from shoal.train.peak_flops import peak_flops

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Data:
    tokenizer: object
    loader: TokenLoader
    eval_set: list[Batch]


def build_data(cfg: JobConfig, model_cfg: ModelConfig, dp_rank: int = 0, dp_size: int = 1) -> Data:
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise UserError("data.tokenizer", cfg.data.tokenizer,
                        f"has {tokenizer.vocab_size} tokens but model.vocab_size={model_cfg.vocab_size}; "
                        f"--set model.vocab_size={tokenizer.vocab_size}")
    cache = build_token_cache(cfg.data.path, tokenizer, cfg.data.cache_dir or None,
                              text_field=cfg.data.text_field, val_fraction=cfg.data.val_fraction)
    t, src = cfg.train, cfg.data.path
    loader = TokenLoader(cache.train, t.seq_len, t.global_batch, t.micro_batch, dp_rank, dp_size, t.seed, source=src)
    eval_set = eval_batches(cache.val, t.seq_len, t.micro_batch * dp_size, t.eval_batches, dp_rank, dp_size, source=src)
    return Data(tokenizer, loader, eval_set)


def build_training_model(cfg: JobConfig, model_cfg: ModelConfig, device: torch.device) -> Transformer:
    model = build_model(model_cfg, device=device, seed=cfg.train.seed)
    apply_activation_checkpointing(model, cfg.train.activation_checkpoint)
    return model.train()


def autocast(precision: str, device: torch.device):
    """bf16 autocast keeps fp32 master weights and optimizer state; fp32 runs as is."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def train_step(model: Transformer, batches: list[Batch], precision: str, device: torch.device) -> torch.Tensor:
    """Forward and backward over this step's micro-batches; returns the mean loss (detached)."""
    AuxLossInjector.grad_scale = 1.0 / len(batches)
    total = torch.zeros((), device=device)
    for inputs, targets in batches:
        with autocast(precision, device):
            loss = cross_entropy(model(inputs.to(device)), targets.to(device)) / len(batches)
        loss.backward()
        total += loss.detach()
    return total


@torch.no_grad()
def evaluate(model: Transformer, batches: list[Batch], precision: str, device: torch.device) -> float:
    model.eval()
    losses = []
    for inputs, targets in batches:
        with autocast(precision, device):
            losses.append(cross_entropy(model(inputs.to(device)), targets.to(device)))
    model.train()
    return float(torch.stack(losses).mean())


def train(cfg: JobConfig, out: Path, *, show: bool = True) -> dict:
    """Train `cfg` and write <out>/metrics.jsonl and <out>/model; returns the summary."""
    t = cfg.train
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(t.seed)
    model_cfg = cfg.model_config()
    data = build_data(cfg, model_cfg)
    model = build_training_model(cfg, model_cfg, device)
    optimizer = build_optimizer(model, t)
    out.mkdir(parents=True, exist_ok=True)
    log, progress = MetricsLog(out / "metrics.jsonl"), Progress(t.steps, enabled=show)
    step_flops = flops_per_token(model_cfg, t.seq_len) * t.global_batch * t.seq_len
    peak = peak_flops(device, t.precision)
    tokens_seen, started, eval_loss = 0, time.perf_counter(), float("nan")
    for step in range(t.steps):
        t0 = time.perf_counter()
        set_lr(optimizer, lr_at(step, t))
        loss = train_step(model, data.loader.next_step(), t.precision, device)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip or float("inf"), foreach=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_time = time.perf_counter() - t0
        tokens_seen += t.global_batch * t.seq_len
        row = dict(step=step + 1, loss=float(loss), lr=lr_at(step, t), grad_norm=float(grad_norm), tokens=tokens_seen,
                   tokens_per_s=t.global_batch * t.seq_len / step_time, step_time_s=step_time,
                   mfu=step_flops / step_time / peak, peak_mem_bytes=peak_mem_bytes(device))
        if (t.eval_every and (step + 1) % t.eval_every == 0) or step + 1 == t.steps:
            row["eval_loss"] = eval_loss = evaluate(model, data.eval_set, t.precision, device)
        log.write(row)
        progress.update(row)
    progress.close()
    log.close()
    from shoal.checkpoint.weights import save_weights

    save_weights(out / "model", model, model_cfg, cfg.data.tokenizer)
    elapsed = time.perf_counter() - started
    summary = {"steps": t.steps, "final loss": row["loss"], "eval loss": eval_loss, "tokens": tokens_seen,
               "time (s)": elapsed, "tokens/s": tokens_seen / elapsed, "MFU (model FLOPs)": step_flops * t.steps / elapsed / peak,
               "params": param_counts(model_cfg).total, "peak memory (GiB)": peak_mem_bytes(device) / 2**30,
               "output": str(out)}
    if show:
        print_summary(summary)
        if t.sample_tokens:
            show_sample(model, data.tokenizer, t.sample_tokens, t.seed)
    return summary


def show_sample(model: Transformer, tokenizer, n_tokens: int, seed: int, prompt: str = "def ") -> None:
    from shoal.train.generate import sample

    model.eval()
    ids = sample(model, tokenizer.encode(prompt), n_tokens, seed=seed, stop_id=tokenizer.eos_id)
    print("sample:\n" + prompt + tokenizer.decode(ids))
