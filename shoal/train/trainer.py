"""The training loop. Setup is build_* functions; `train` only orchestrates and fits on a screen."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from shoal.checkpoint.checkpointer import Checkpointer
from shoal.checkpoint.choose import checkpoint_root
from shoal.checkpoint.final_export import write_final_weights
from shoal.comm.counter import CommCounter
from shoal.config import JobConfig
from shoal.job import Job, resolve
from shoal.launch.env import world_size
from shoal.launch.shared_dir import require_shared
from shoal.debug.memory_snapshot import MemorySnapshot
from shoal.data.loader import TokenLoader, eval_batches
from shoal.data.shards import load_data
from shoal.measure.peak import job_peak
from shoal.model.analytics import flops_per_token, param_counts
from shoal.model.transformer import build_model, cross_entropy
from shoal.parallel.compression import wire_fields
from shoal.parallel.parallel_model import ParallelModel
from shoal.parallel.parallelize import parallelize
from shoal.parallel.replicas import join_replicas, replica_place
from shoal.train.distributed import Runtime, enable_debugging, group_labels, init_runtime, mark, rank_stats, shutdown
from shoal.train.metrics import MetricsLog, Progress, peak_mem_bytes, print_summary, reset_peak_mem
from shoal.train.memory import RankMemory, StateBytes, model_state
from shoal.train import preempt
from shoal.train.nonfinite import NonFiniteGuard
from shoal.train.prediction import RunPrediction, predict_this_run
from shoal.train.optim import build_optimizer, clip_grad_norm, lr_at, set_lr
from shoal.train.rundir import no_space_left
from shoal.train.run_info import write_run_info

from shoal.parallel.parallel_model import Batch


@dataclass
class Data:
    tokenizer: object
    loader: TokenLoader
    eval_set: list[Batch]


def build_data(job: Job, dp_rank: int = 0, dp_size: int = 1) -> Data:
    cfg = job.cfg
    tokenizer, cache = load_data(cfg.data, job.model.vocab_size)
    t, src = cfg.train, cfg.data.path
    # Replica groups each train their share of the whole batch: group g is the g-th block of dp ranks.
    place = replica_place()
    group, groups = (place.group, place.groups) if place else (0, 1)
    batch = t.global_batch * groups
    loader = TokenLoader(cache.train, t.seq_len, batch, job.layout.micro_batch, group * dp_size + dp_rank,
                         groups * dp_size, t.seed, source=src)
    # Evaluation batches hold the whole batch's sequences, so every layout evaluates the same text.
    eval_set = eval_batches(cache.val, t.seq_len, batch, t.eval_batches, dp_rank, dp_size, source=src)
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
    job = job if isinstance(job, Job) else resolve(job, world_size())
    cfg, t, model_cfg = job.cfg, job.cfg.train, job.model
    rt = init_runtime(job)
    reset_peak_mem(rt.device)  # this run's peak, not an earlier run's in the same process
    if cfg.checkpoint.every:  # node-local checkpoint directories would split each checkpoint's shards
        require_shared(checkpoint_root(cfg, out), "checkpoint.dir" if cfg.checkpoint.dir else "--out", rt.world_size)
    torch.manual_seed(t.seed)
    data = build_data(job, rt.dp_rank, rt.dims.dp)
    pm = build_parallel_model(job, rt)
    optimizer = build_optimizer(pm, t, rt, cfg.parallel.zero)
    enable_debugging(cfg, rt)
    snapshot = MemorySnapshot(cfg.debug.memory_snapshot, rt.device, out, rt.rank)
    counter = CommCounter(group_labels(rt))
    memory = RankMemory(pm.parameters(), rt.device, measure_activations=not t.compile)
    if rt.is_main:
        out.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(cfg, out, rt, pm, optimizer, data.loader, resume)
    start = ckpt.resume()  # steps already done (0 for a fresh run)
    step_flops = flops_per_token(model_cfg, t.seq_len) * t.global_batch * t.seq_len
    peak = job_peak(rt.device, t.precision, rt.world_size)  # the job's hardware: 4 ranks on 2 cores get 2
    plan = predict_this_run(job, rt, step_flops, peak.flops, say=print if show else None)  # rank 0 only
    write_run_info(job, rt, out, start, plan)  # <out>/run.json for `shoal report` and `shoal plan --validate`
    replicas = join_replicas(rt, pm, optimizer, data.loader, start)  # other replica groups, if any
    log = MetricsLog(out / "metrics.jsonl", enabled=rt.is_main, append=start > 0 or replicas.rejoining)
    progress = Progress(t.steps, start, enabled=show and rt.is_main)
    guard = NonFiniteGuard(t.on_nonfinite, before_stop=lambda: (ckpt.close(), progress.close()), report=rt.is_main)
    tokens_seen, started, eval_loss, row = start * t.global_batch * t.seq_len, time.perf_counter(), float("nan"), {}
    step = start
    while step < t.steps:
        t0 = time.perf_counter()
        step = replicas.start_step(step)  # a rejoining replica group takes the live state and step here
        mark(step + 1, "train")
        set_lr(optimizer, lr_at(step, t))
        counter.reset()
        with counter:  # everything the step sends, ZeRO-1's parameter broadcast in optimizer.step included
            with memory.measure_first_step():
                loss = pm.forward_backward(data.loader.next_step())
            replicas.average_grads(pm.parameters())
            grad_norm = clip_grad_norm(list(pm.parameters()), t.grad_clip, rt)
        loss = rt.global_mean(loss)  # for the log, not the step's traffic; equal on every rank, so the
        #                              guard below decides alike everywhere
        if not replicas.should_commit():  # a replica group died mid-step: nobody steps, the step is redone
            optimizer.zero_grad(set_to_none=True)
            continue
        with counter:
            if guard.allows_update(step + 1, loss, grad_norm):  # NaN/Inf: stop (raises) or skip the update
                optimizer.step()
            if pm.diloco is not None:  # DiLoCo's outer step, every diloco_inner_steps (or per fragment)
                pm.diloco.after_step(step + 1, last=step + 1 == t.steps)
        state = model_state(pm.parameters(), optimizer, pm.slow_link_state())  # after the step: AdamW state exists
        optimizer.zero_grad(set_to_none=True)
        step_time = time.perf_counter() - t0
        tokens_seen += t.global_batch * t.seq_len
        row = dict(step=step + 1, loss=loss, lr=lr_at(step, t), grad_norm=grad_norm, tokens=tokens_seen,
                   tokens_per_s=t.global_batch * t.seq_len / step_time, step_time_s=step_time,
                   mfu=step_flops / step_time / peak.flops, **measured(job, rt, pm, counter, state, memory, step_time),
                   **(plan.metrics_fields() if plan else {}), **replicas.row())
        if (t.eval_every and (step + 1) % t.eval_every == 0) or step + 1 == t.steps:
            mark(step + 1, "eval")
            row["eval_loss"] = eval_loss = rt.global_mean(pm.eval_loss(data.eval_set, job.layout.micro_batch))
            guard.check_eval(step + 1, eval_loss)  # NaN weights after the update: stop, save nothing
        stopping = step + 1 < t.steps and preempt.agreed(rt)  # SIGTERM on any rank: all stop after this step
        log.write(row, sync=ckpt.due(step + 1) or stopping)  # on disk at least as far as the checkpoint
        progress.update(row)
        if ckpt.due(step + 1) or stopping:
            guard.check_weights(step + 1, pm.parameters(), rt)  # an update that overflowed never reaches disk
        ckpt.maybe_save(step + 1, row["loss"], stopping=stopping)
        if ckpt.due(step + 1):
            progress.event(f"checkpoint at step {step + 1} ({'saving in the background' if cfg.checkpoint.async_save else 'saved'})")
        if stopping:
            for done in (ckpt, progress, log):
                done.close()
            raise preempt.stopped(rt, step + 1, ckpt.path_of(step + 1))
        step += 1
    replicas.close()
    ckpt.close()  # waits for a save still being written in the background
    snapshot.dump()
    progress.close()
    log.close()
    # Tensor by tensor: rank 0 never holds more than one full tensor beyond its own shard.
    with no_space_left(out / "model", **final_model_fix(ckpt)):
        write_final_weights(pm.modules, model_cfg, cfg.data.tokenizer, out / "model", rt)
    summary = run_summary(job, rt, pm, log, row, eval_loss, tokens_seen, time.perf_counter() - started, peak, out, plan)
    if show and rt.is_main:
        print_summary(summary)
        if t.sample_tokens:
            show_sample(out / "model", data.tokenizer, t.sample_tokens, t.seed)
    if not keep_process_group:
        shutdown()
    return summary



def final_model_fix(ckpt: Checkpointer) -> dict:
    """What to say when the disk refuses the final model: with a checkpoint of the last step, the same
    command writes only the model (checkpoint/choose.py); without one, the run must be done again."""
    if ckpt.every:
        return dict(kept=f"every step is done and {ckpt.path_of(ckpt.total)} is committed; ",
                    then=", then run the same command again: it only writes the model")
    return dict(then=", or pick an --out on another disk, and run again (checkpoint.every=0: no checkpoint to "
                     "write the model from)")


def measured(job: Job, rt: Runtime, pm: ParallelModel, counter: CommCounter, state: StateBytes, memory: RankMemory,
             step_time: float) -> dict:
    """A step's measurements beside its loss: memory (every rank's, when it changed), bytes on the
    wire by collective, dtype and parallel dimension, the spread of step time across ranks."""
    mine = memory.kinds(state)
    spread, by_rank = rank_stats(rt, step_time, mine)
    return dict(peak_mem_bytes=mine["peak"], model_state_bytes=state.total,
                comm_bytes=dict(counter.bytes), comm_bytes_by_dtype=dict(counter.by_dtype),
                comm_bytes_by_dim=dict(counter.by_dim), **wire_fields(pm, counter, job.layout.grad_compression),
                **spread, **memory.row_fields(by_rank))


def run_summary(job: Job, rt: Runtime, pm: ParallelModel, log: MetricsLog, row: dict, eval_loss: float,
                tokens_seen: int, elapsed: float, peak, out: Path, plan: RunPrediction | None = None) -> dict:
    """The end-of-run table; throughput over the steps the progress line shows (warm-up left out),
    and on rank 0 the planner's prediction for this run beside the measurement."""
    t, model_cfg = job.cfg.train, job.model
    step_flops = flops_per_token(model_cfg, t.seq_len) * t.global_batch * t.seq_len
    step_time, warmup = log.steady_step_time()
    which = f"without {warmup} warm-up steps" if warmup else "all steps"
    mfu, peak_mem = step_flops / step_time / peak.flops, peak_mem_bytes(rt.device)
    summary = {"steps": t.steps, "final loss": row.get("loss"), "eval loss": eval_loss, "tokens": tokens_seen,
               "time (s)": elapsed, f"tokens/s ({which})": t.global_batch * t.seq_len / step_time,
               "step time (s, same steps)": step_time, f"MFU (model FLOPs, same steps, vs {peak.label})": mfu,
               "params": param_counts(model_cfg).total, "attention": pm.attention,
               "ranks": rt.world_size, "peak memory (GiB, rank 0)": peak_mem / 2**30}
    if plan is not None:
        summary.update(plan.summary_rows(step_time, mfu, peak_mem))
    return {**summary, "output": str(out)}

SAMPLE_MAX_BYTES = 2e9


def show_sample(model_dir: Path, tokenizer, n_tokens: int, seed: int, prompt: str = "def ") -> None:
    """Sample from the weights just written, on rank 0's CPU: a whole model in one process, so only
    for models up to SAMPLE_MAX_BYTES (larger ones would not fit beside training, or take too long)."""
    from shoal.checkpoint.weights import WEIGHTS, load_weights
    from shoal.train.generate import sample

    size = (model_dir / WEIGHTS).stat().st_size
    if size > SAMPLE_MAX_BYTES:
        print(f"sample skipped: the model is {size / 1e9:.1f} GB (over {SAMPLE_MAX_BYTES / 1e9:.0f} GB); "
              f"run `shoal generate {model_dir.parent}` instead", file=sys.stderr)
        return
    model, _, _ = load_weights(model_dir)
    ids = sample(model, tokenizer.encode(prompt), n_tokens, seed=seed, stop_id=tokenizer.eos_id)
    print("sample:\n" + prompt + tokenizer.decode(ids))
