"""The training loop. Setup is build_* functions; `train` only orchestrates and fits on a screen."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from shoal.checkpoint.checkpointer import Checkpointer
from shoal.comm.counter import CommCounter
from shoal.config import JobConfig
from shoal.job import Job, env_world_size, resolve
from shoal.debug.memory_snapshot import MemorySnapshot
from shoal.data.loader import TokenLoader, eval_batches
from shoal.data.shards import build_token_cache
from shoal.data.tokenizer import load_tokenizer
from shoal.errors import UserError
from shoal.measure.peak import job_peak
from shoal.model.analytics import flops_per_token, param_counts
from shoal.model.config import ModelConfig
from shoal.model.transformer import build_model, cross_entropy
from shoal.parallel.parallel_model import ParallelModel
from shoal.parallel.parallelize import parallelize
from shoal.train.distributed import Runtime, enable_debugging, init_runtime, mark, shutdown, straggler_stats
from shoal.train.memory_check import predicted_peak_bytes
from shoal.train.metrics import MetricsLog, Progress, peak_mem_bytes, print_summary
from shoal.train.memory import model_state_bytes
from shoal.train.optim import build_optimizer, clip_grad_norm, lr_at, set_lr

from shoal.parallel.parallel_model import Batch


@dataclass
class Data:
    tokenizer: object
    loader: TokenLoader
    eval_set: list[Batch]


def build_data(job: Job, dp_rank: int = 0, dp_size: int = 1) -> Data:
    cfg, model_cfg = job.cfg, job.model
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise UserError("data.tokenizer", cfg.data.tokenizer,
                        f"has {tokenizer.vocab_size} tokens but model.vocab_size={model_cfg.vocab_size}; "
                        f"--set model.vocab_size={tokenizer.vocab_size}")
    cache = build_token_cache(cfg.data.path, tokenizer, cfg.data.cache_dir or None,
                              text_field=cfg.data.text_field, val_fraction=cfg.data.val_fraction)
    t, src = cfg.train, cfg.data.path
    loader = TokenLoader(cache.train, t.seq_len, t.global_batch, job.layout.micro_batch, dp_rank, dp_size, t.seed, source=src)
    # Evaluation batches hold global_batch sequences, so every layout evaluates the same text.
    eval_set = eval_batches(cache.val, t.seq_len, t.global_batch, t.eval_batches, dp_rank, dp_size, source=src)
    return Data(tokenizer, loader, eval_set)


def build_parallel_model(job: Job, rt: Runtime) -> ParallelModel:
    # Built on the meta device (nothing allocated); parallelize allocates this rank's share and
    # initializes it with the values one process would give it (what loss parity needs).
    model = build_model(job.model, device="meta").train()
    return parallelize(model, job, rt.mesh, rt.expert_mesh, rt.device, loss_fn=cross_entropy)


def train(job: Job | JobConfig, out: Path, *, show: bool = True, keep_process_group: bool = False,
          resume: str = "auto") -> dict:
    """Train on this process's share of the job; rank 0 writes <out>/metrics.jsonl and <out>/model.

    job: a resolved Job, or a JobConfig, resolved here for this process's WORLD_SIZE.
    resume: `auto` continues from the newest intact checkpoint if there is one, `never` starts
    over, anything else is the path of a checkpoint to start from (see shoal/checkpoint/).
    """
    job = job if isinstance(job, Job) else resolve(job, env_world_size())
    cfg, t, model_cfg = job.cfg, job.cfg.train, job.model
    rt = init_runtime(job)
    torch.manual_seed(t.seed)
    data = build_data(job, rt.dp_rank, rt.dims.dp)
    pm = build_parallel_model(job, rt)
    optimizer = build_optimizer(pm, t, rt, cfg.parallel.zero)
    enable_debugging(cfg, rt)
    snapshot = MemorySnapshot(cfg.debug.memory_snapshot, rt.device, out, rt.rank)
    counter = CommCounter()
    if rt.is_main:
        out.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(cfg, out, rt, pm, optimizer, data.loader, resume)
    start = ckpt.resume()  # steps already done (0 for a fresh run)
    log = MetricsLog(out / "metrics.jsonl", enabled=rt.is_main, append=start > 0)
    progress = Progress(t.steps, start, enabled=show and rt.is_main)
    step_flops = flops_per_token(model_cfg, t.seq_len) * t.global_batch * t.seq_len
    peak = job_peak(rt.device, t.precision, rt.world_size)  # the job's hardware: 4 ranks on 2 cores get 2
    tokens_seen, started, eval_loss, row = start * t.global_batch * t.seq_len, time.perf_counter(), float("nan"), {}
    for step in range(start, t.steps):
        t0 = time.perf_counter()
        mark(step + 1, "train")
        set_lr(optimizer, lr_at(step, t))
        counter.bytes.clear()
        with counter:  # everything the step sends, ZeRO-1's parameter broadcast in optimizer.step included
            loss = pm.forward_backward(data.loader.next_step())
            grad_norm = clip_grad_norm(list(pm.parameters()), t.grad_clip, rt)
            optimizer.step()
        state_bytes = model_state_bytes(pm.parameters(), optimizer)  # after the step: AdamW state exists
        optimizer.zero_grad(set_to_none=True)
        step_time = time.perf_counter() - t0
        tokens_seen += t.global_batch * t.seq_len
        row = dict(step=step + 1, loss=rt.global_mean(loss), lr=lr_at(step, t), grad_norm=grad_norm, tokens=tokens_seen,
                   tokens_per_s=t.global_batch * t.seq_len / step_time, step_time_s=step_time,
                   mfu=step_flops / step_time / peak.flops, peak_mem_bytes=peak_mem_bytes(rt.device),
                   model_state_bytes=state_bytes, comm_bytes=dict(counter.bytes), **straggler_stats(rt, step_time))
        if (t.eval_every and (step + 1) % t.eval_every == 0) or step + 1 == t.steps:
            mark(step + 1, "eval")
            row["eval_loss"] = eval_loss = rt.global_mean(pm.eval_loss(data.eval_set, job.layout.micro_batch))
        log.write(row)
        progress.update(row)
        ckpt.maybe_save(step + 1, row["loss"])
    ckpt.close()  # waits for a save still being written in the background
    snapshot.dump()
    progress.close()
    log.close()
    elapsed = time.perf_counter() - started
    final = gather_full_model(pm, model_cfg, rt)
    if rt.is_main:
        from shoal.checkpoint.weights import save_weights

        save_weights(out / "model", final, model_cfg, cfg.data.tokenizer)
    step_time, warmup = log.steady_step_time()  # what the progress line shows, without the warm-up steps
    which = f"without {warmup} warm-up steps" if warmup else "all steps"
    summary = {"steps": t.steps, "final loss": row.get("loss"), "eval loss": eval_loss, "tokens": tokens_seen,
               "time (s)": elapsed, f"tokens/s ({which})": t.global_batch * t.seq_len / step_time,
               f"MFU (model FLOPs, same steps, vs {peak.label})": step_flops / step_time / peak.flops,
               "params": param_counts(model_cfg).total, "attention": pm.attention,
               "ranks": rt.world_size, "peak memory (GiB, rank 0)": peak_mem_bytes(rt.device) / 2**30,
               "predicted peak memory (GiB, planner)": predicted_peak_bytes(job, rt.device) / 2**30, "output": str(out)}
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
