"""The training loop. Setup is build_* functions; `train` only orchestrates and fits on a screen."""

from __future__ import annotations

import time
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from shoal.checkpoint.checkpointer import Checkpointer
from shoal.config import JobConfig
from shoal.data.loader import TokenLoader, eval_batches
from shoal.data.shards import build_token_cache
from shoal.data.tokenizer import load_tokenizer
from shoal.errors import UserError
from shoal.model.analytics import flops_per_token, param_counts
from shoal.model.config import ModelConfig
from shoal.model.moe import AuxLossInjector
from shoal.model.transformer import build_model, cross_entropy
from shoal.parallel.parallelize import ParallelModel, parallelize
from shoal.train.comm_stats import CommCounter, model_state_bytes
from shoal.train.distributed import Runtime, enable_debugging, init_runtime, mark, shutdown, straggler_stats
from shoal.train.metrics import MetricsLog, Progress, peak_mem_bytes, print_summary
from shoal.train.nonfinite import NonFiniteGuard
from shoal.train.optim import build_optimizer, clip_grad_norm, lr_at, set_lr
from shoal.train.peak_flops import peak_flops
from shoal.train.rundir import no_space_left

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
    # Evaluation batches hold global_batch sequences, so every layout evaluates the same text.
    eval_set = eval_batches(cache.val, t.seq_len, t.global_batch, t.eval_batches, dp_rank, dp_size, source=src)
    return Data(tokenizer, loader, eval_set)


def n_microbatches(cfg: JobConfig, rt: Runtime) -> int:
    per_rank = cfg.train.global_batch // rt.dims.dp
    return cfg.parallel.pp_microbatches or per_rank // cfg.train.micro_batch


def build_parallel_model(cfg: JobConfig, model_cfg: ModelConfig, rt: Runtime) -> ParallelModel:
    # Built on the meta device (nothing allocated); parallelize allocates this rank's share and
    # initializes it with the values one process would give it (what loss parity needs).
    model = build_model(model_cfg, device="meta").train()
    return parallelize(model, cfg, rt.dims, rt.mesh, rt.expert_mesh, rt.device, loss_fn=cross_entropy,
                       n_microbatches=n_microbatches(cfg, rt))


def autocast(precision: str, device: torch.device):
    """bf16 autocast keeps fp32 master weights and optimizer state; fp32 runs as is."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def loss_context(rt: Runtime):
    """Under tensor parallelism the logits stay sharded over the vocabulary; the loss is computed in place."""
    if rt.dims.tp == 1:
        return nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _scalar(loss: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (loss.full_tensor() if isinstance(loss, DTensor) else loss).detach().float()


def run_schedule(pm: ParallelModel, method: str, inputs, targets) -> torch.Tensor:
    """One pipeline step (or forward-only pass) over the whole local batch; mean loss on the last stage."""
    losses: list = []
    run = getattr(pm.schedule, method)
    if pm.has_first_stage and pm.has_last_stage:
        run(inputs, target=targets, losses=losses)
    elif pm.has_first_stage:
        run(inputs)
    elif pm.has_last_stage:
        run(target=targets, losses=losses)
    else:
        run()
    return torch.stack([_scalar(x) for x in losses]).mean() if losses else torch.zeros(())


def train_step(pm: ParallelModel, batches: list[Batch], precision: str, rt: Runtime) -> torch.Tensor:
    """Forward and backward over this step's micro-batches; returns this rank's mean loss (detached)."""
    dev = rt.device
    with autocast(precision, dev), loss_context(rt):
        if pm.schedule is not None:
            AuxLossInjector.grad_scale = 1.0  # the schedule itself divides gradients by the micro-batch count
            return run_schedule(pm, "step", torch.cat([x for x, _ in batches]).to(dev),
                                torch.cat([y for _, y in batches]).to(dev))
        model, total = pm.modules[0], torch.zeros((), device=dev)
        AuxLossInjector.grad_scale = 1.0 / len(batches)
        for i, (inputs, targets) in enumerate(batches):
            last = i == len(batches) - 1
            if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce gradients once per step
                model.set_requires_gradient_sync(last)
                if pm.zero == 2:  # ZeRO-2 keeps parameters gathered until the step's last backward
                    model.set_reshard_after_backward(last)
            with model.no_sync() if hasattr(model, "no_sync") and not last else nullcontext():
                loss = cross_entropy(model(inputs.to(dev)), targets.to(dev)) / len(batches)
                loss.backward()
            total += _scalar(loss)
    return total


@torch.no_grad()
def evaluate(pm: ParallelModel, batches: list[Batch], precision: str, micro_batch: int, rt: Runtime) -> float:
    for m in pm.modules:
        m.eval()
    losses = []
    with autocast(precision, rt.device), loss_context(rt):
        for inputs, targets in batches:
            if pm.schedule is not None:
                losses.append(run_schedule(pm, "eval", inputs.to(rt.device), targets.to(rt.device)))
            else:  # in micro-batches, as training runs, to bound memory
                for x, y in zip(inputs.split(micro_batch), targets.split(micro_batch)):
                    losses.append(_scalar(cross_entropy(pm.modules[0](x.to(rt.device)), y.to(rt.device))))
    for m in pm.modules:
        m.train()
    return rt.global_mean(torch.stack(losses).mean())


def train(cfg: JobConfig, out: Path, *, show: bool = True, keep_process_group: bool = False,
          resume: str = "auto") -> dict:
    """Train `cfg` on this process's share of the job; rank 0 writes <out>/metrics.jsonl and <out>/model.

    resume: `auto` continues from the newest intact checkpoint if there is one, `never` starts
    over, anything else is the path of a checkpoint to start from (see shoal/checkpoint/).
    """
    t = cfg.train
    rt = init_runtime(cfg)
    torch.manual_seed(t.seed)
    model_cfg = cfg.model_config()
    data = build_data(cfg, model_cfg, rt.dp_rank, rt.dims.dp)
    pm = build_parallel_model(cfg, model_cfg, rt)
    optimizer = build_optimizer(pm, t, rt, cfg.parallel.zero)
    enable_debugging(cfg, rt)
    counter = CommCounter()
    if rt.is_main:
        out.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(cfg, out, rt, pm, optimizer, data.loader, resume)
    start = ckpt.resume()  # steps already done (0 for a fresh run)
    log = MetricsLog(out / "metrics.jsonl", enabled=rt.is_main, append=start > 0)
    progress = Progress(t.steps, start, enabled=show and rt.is_main)
    guard = NonFiniteGuard(t.on_nonfinite, before_stop=lambda: (ckpt.close(), progress.close()), report=rt.is_main)
    step_flops = flops_per_token(model_cfg, t.seq_len) * t.global_batch * t.seq_len
    peak = peak_flops(rt.device, t.precision) * rt.world_size
    tokens_seen, started, eval_loss, row = start * t.global_batch * t.seq_len, time.perf_counter(), float("nan"), {}
    for step in range(start, t.steps):
        t0 = time.perf_counter()
        mark(step + 1, "train")
        set_lr(optimizer, lr_at(step, t))
        counter.bytes.clear()
        with counter:  # everything the step sends, ZeRO-1's parameter broadcast in optimizer.step included
            loss = train_step(pm, data.loader.next_step(), t.precision, rt)
            grad_norm = clip_grad_norm(list(pm.parameters()), t.grad_clip, rt)
            state_bytes = model_state_bytes(pm.parameters(), optimizer)
        loss = rt.global_mean(loss)  # equal on every rank, so every rank's guard decides alike
        with counter:
            if guard.allows_update(step + 1, loss, grad_norm):  # NaN/Inf: stop (raises) or skip the update
                optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_time = time.perf_counter() - t0
        tokens_seen += t.global_batch * t.seq_len
        row = dict(step=step + 1, loss=loss, lr=lr_at(step, t), grad_norm=grad_norm, tokens=tokens_seen,
                   tokens_per_s=t.global_batch * t.seq_len / step_time, step_time_s=step_time,
                   mfu=step_flops / step_time / peak, peak_mem_bytes=peak_mem_bytes(rt.device),
                   model_state_bytes=state_bytes, comm_bytes=dict(counter.bytes), **straggler_stats(rt, step_time))
        if (t.eval_every and (step + 1) % t.eval_every == 0) or step + 1 == t.steps:
            mark(step + 1, "eval")
            row["eval_loss"] = eval_loss = evaluate(pm, data.eval_set, t.precision, t.micro_batch, rt)
        log.write(row, sync=ckpt.due(step + 1))  # on disk at least as far as the checkpoint
        progress.update(row)
        ckpt.maybe_save(step + 1, row["loss"])
    ckpt.close()  # waits for a save still being written in the background
    progress.close()
    log.close()
    elapsed = time.perf_counter() - started
    final = gather_full_model(pm, model_cfg, rt)
    if rt.is_main:
        from shoal.checkpoint.weights import save_weights

        with no_space_left(out / "model"):
            save_weights(out / "model", final, model_cfg, cfg.data.tokenizer)
    summary = {"steps": t.steps, "final loss": row.get("loss"), "eval loss": eval_loss, "tokens": tokens_seen,
               "time (s)": elapsed, "tokens/s": (t.steps - start) * t.global_batch * t.seq_len / elapsed,
               "MFU (model FLOPs)": step_flops * (t.steps - start) / elapsed / peak, "params": param_counts(model_cfg).total,
               "ranks": rt.world_size, "peak memory (GiB, rank 0)": peak_mem_bytes(rt.device) / 2**30, "output": str(out)}
    if show and rt.is_main:
        print_summary(summary)
        if t.sample_tokens:
            show_sample(final, data.tokenizer, t.sample_tokens, t.seed)
    if not keep_process_group:
        shutdown()
    return summary


def gather_full_model(pm: ParallelModel, model_cfg: ModelConfig, rt: Runtime):
    """The trained weights as one plain model on rank 0 (None elsewhere): for export and sampling."""
    if rt.world_size == 1:
        return pm.modules[0]
    import logging

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # Gathering 2-D sharded (FSDP x EP) weights takes two all-gathers; DTensor warns about it, once per tensor.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)

    # cpu_offload would keep the result on global rank 0 only; each pipeline rank needs its stages'.
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    local = {}
    for m in pm.modules:  # every rank takes part: gathering shards is collective
        local.update({k: v.cpu() for k, v in get_model_state_dict(m, options=options).items()})
    pieces = [None] * rt.world_size if rt.is_main else None
    dist.gather_object(local if rt.dims.coords(rt.rank)["dp"] == 0 and rt.dims.coords(rt.rank)["tp"] == 0 else {},
                       pieces, dst=0)
    if not rt.is_main:
        return None
    model = build_model(model_cfg, device="cpu", seed=None)
    merged = {k: v for piece in pieces for k, v in piece.items()}
    model.load_state_dict(merged, strict=not model_cfg.tie_embeddings)
    return model.eval()


def show_sample(model, tokenizer, n_tokens: int, seed: int, prompt: str = "def ") -> None:
    from shoal.train.generate import sample

    model.eval()
    ids = sample(model, tokenizer.encode(prompt), n_tokens, seed=seed, stop_id=tokenizer.eos_id)
    print("sample:\n" + prompt + tokenizer.decode(ids))
