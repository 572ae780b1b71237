"""The training loop. `train` orchestrates; setup is the build_* functions below and build_data
(data.py), one step's work is TrainStep (step.py), and what each step leaves on disk is Outputs
(outputs.py)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch

from shoal.checkpoint.checkpointer import Checkpointer
from shoal.checkpoint.choose import checkpoint_root
from shoal.checkpoint.final_export import write_final_weights
from shoal.config import JobConfig
from shoal.debug.memory_snapshot import MemorySnapshot
from shoal.hardware.peak import Peak, job_peak
from shoal.job import Job, resolve
from shoal.model.analytics import flops_per_token, param_counts
from shoal.model.transformer import build_model, cross_entropy
from shoal.parallel.parallel_model import ParallelModel
from shoal.parallel.parallelize import parallelize
from shoal.planner.prediction import RunPrediction, predict_job
from shoal.rundir.disk import no_space_left
from shoal.rundir.metrics import Steady
from shoal.rundir.names import MODEL
from shoal.rundir.run_info import write_run_info
from shoal.train import preempt
from shoal.train.distributed import Runtime, enable_debugging, init_runtime, mark, require_shared, shutdown
from shoal.train.data import Data, build_data
from shoal.train.loss_scale import build_scaler
from shoal.train.memory import peak_mem_bytes, reset_peak_mem
from shoal.train.optim import build_optimizer
from shoal.train.outputs import Outputs
from shoal.train.profiling import StepProfiler
from shoal.train.progress import print_summary
from shoal.train.replicas import join_replicas
from shoal.train.step import TrainStep
from shoal.worker.env import local_world_size, world_size


def train(job: Job | JobConfig, out: Path, *, show: bool = True, keep_process_group: bool = False,
          resume: str = "auto") -> dict:
    """Train on this process's share of the job; rank 0 writes the run into <out> (shoal/rundir/).

    job: a resolved Job, or a JobConfig, resolved here for this process's WORLD_SIZE.
    resume: `auto` continues from the newest intact checkpoint if there is one, `never` starts
    over, anything else is the path of a checkpoint to start from (see shoal/checkpoint/).
    """
    job = job if isinstance(job, Job) else resolve(job, world_size())
    cfg, t = job.cfg, job.cfg.train
    rt = init_runtime(job)
    reset_peak_mem(rt.device)  # this run's peak, not an earlier run's in the same process
    if cfg.checkpoint.every:  # node-local checkpoint directories would split each checkpoint's shards
        require_shared(rt, checkpoint_root(cfg, out), "checkpoint.dir" if cfg.checkpoint.dir else "--out")
    torch.manual_seed(t.seed)
    data = build_data(job, rt.dp_rank, rt.dims.dp)
    pm = build_parallel_model(job, rt)
    optimizer = build_optimizer(pm, t, rt, cfg.parallel.zero)
    enable_debugging(cfg, rt)
    snapshot = MemorySnapshot(cfg.debug.memory_snapshot, rt.device, out, rt.rank)
    if rt.is_main:
        out.mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(cfg, out, rt, pm, optimizer, data.loader, resume)
    start = ckpt.resume()  # steps already done (0 for a fresh run)
    peak, plan = plan_this_run(job, rt, out, start, say=print if show else None)  # rank 0 writes run.json
    replicas = join_replicas(rt, pm, optimizer, data.loader, start)  # other replica groups, if any
    outputs = Outputs(job, rt, out, ckpt, start, show=show, append=start > 0 or replicas.rejoining)
    step = TrainStep(job, rt, pm, optimizer, data.loader, replicas, outputs.guard, start=start,
                     step_flops=step_flops(job), peak_flops=peak.flops, plan=plan)
    profiler = StepProfiler(cfg.debug, rt.rank, out, rt.device)  # debug.profile_steps, on the ranks asked
    started, eval_loss, row = time.perf_counter(), math.nan, {}
    while step.done < t.steps and not data.loader.exhausted():  # data.repeat=false: where a corpus ends
        profiler.at(step.done + 1)
        if (done := step()) is None:
            continue  # a replica group died mid-step: nobody stepped, the step is redone
        last = done.step == t.steps or data.loader.exhausted() is not None
        row = step.row(done) | data.metrics()
        if (t.eval_every and done.step % t.eval_every == 0) or last:
            row["eval_loss"] = eval_loss = evaluate(pm, data, job, rt, outputs.guard, done.step)
        stopping = not last and preempt.agreed(rt)  # SIGTERM on any rank: all stop after this step
        outputs.keep(row, pm.parameters(), stopping=stopping)
        if stopping:
            outputs.close()
            raise preempt.stopped(rt, done.step, ckpt.path_of(done.step))
    profiler.close()
    replicas.close()
    outputs.close()  # waits for a save still being written in the background
    snapshot.dump()
    with no_space_left(out / MODEL, **final_model_fix(ckpt)):  # tensor by tensor: rank 0 holds at most one
        write_final_weights(pm.modules, job.model, cfg.data.tokenizer, out / MODEL, rt)  # full tensor beyond its shard
    steady = outputs.log.steady(start)
    summary = run_summary(job, rt, pm, row, eval_loss, step.tokens, time.perf_counter() - started, steady, peak,
                          out, plan)
    if show and rt.is_main:
        print_summary(summary)
        if t.sample_tokens:
            show_sample(out / MODEL, data.tokenizer, t.sample_tokens, t.seed, t.sample_prompt)
    if not keep_process_group:
        shutdown()
    return summary


def build_parallel_model(job: Job, rt: Runtime) -> ParallelModel:
    # Built on the meta device (nothing allocated); parallelize allocates this rank's share and
    # initializes it with the values one process would give it (what loss parity needs), or with the
    # pretrained folder's (model.init_from), each rank reading only what it holds.
    model = build_model(job.model, device="meta").train()
    weights = None
    if job.cfg.model.init_from:
        from shoal.checkpoint.pretrained import open_weights

        weights = open_weights(job.cfg.model.init_from, job.model)
    pm = parallelize(model, job, rt.mesh, rt.expert_mesh, rt.device, loss_fn=cross_entropy, weights=weights)
    if weights is not None:
        weights.refuse_nonfinite()  # every rank alike, once all have read their shares
    pm.loss_scaler = build_scaler(job, rt)  # fp16 only
    return pm


def step_flops(job: Job) -> float:
    """Model FLOPs of one optimizer step (shoal/model/analytics.py's convention: MFU, not HFU)."""
    t = job.cfg.train
    return flops_per_token(job.model, t.seq_len) * t.global_batch * t.seq_len


def plan_this_run(job: Job, rt: Runtime, out: Path, start: int, *, say=None) -> tuple[Peak, RunPrediction | None]:
    """The peak FLOP/s this run's MFU divides by (the job's hardware: 4 ranks on 2 cores get 2 cores'),
    and on rank 0 the planner's prediction for the run and <out>/run.json with it. `say` prints the
    one line shown when this machine must be measured first (once; the profile is cached)."""
    from shoal.hardware.local import local_profile_path

    peak = job_peak(rt.device, job.cfg.train.precision, rt.world_size)
    if not rt.is_main:
        return peak, None
    if rt.device.type == "cpu" and say and not local_profile_path().exists():
        say(f"measuring this machine once for the planner's prediction (about 10 s; cached in {local_profile_path()})")
    local_world, name = local_world_size(job.world), device_name(rt.device)
    plan = predict_job(job, rt.device.type, name, local_world).with_mfu(step_flops(job), peak.flops)
    write_run_info(job, out, start, local_world=local_world, device=rt.device.type, device_name=name, prediction=plan)
    return peak, plan


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def evaluate(pm: ParallelModel, data: Data, job: Job, rt: Runtime, guard, step: int) -> float:
    """The held-out loss after `step` (collective); NaN weights after the update stop the run here."""
    mark(step, "eval")
    loss = rt.global_mean(pm.eval_loss(data.eval_set, job.layout.micro_batch))
    guard.check_eval(step, loss)
    return loss


def final_model_fix(ckpt: Checkpointer) -> dict:
    """What to say when the disk refuses the final model: with a checkpoint of the last step, the same
    command writes only the model (checkpoint/choose.py); without one, the run must be done again."""
    if ckpt.every:
        return dict(kept=f"every step is done and {ckpt.path_of(ckpt.total)} is committed; ",
                    then=", then run the same command again: it only writes the model")
    return dict(then=", or pick an --out on another disk, and run again (checkpoint.every=0: no checkpoint to "
                     "write the model from)")


def run_summary(job: Job, rt: Runtime, pm: ParallelModel, row: dict, eval_loss: float, tokens_seen: int,
                elapsed: float, steady: Steady, peak: Peak, out: Path, plan: RunPrediction | None = None) -> dict:
    """The end-of-run table; speed over the steady steps (rundir.metrics.steady: the medians the
    report and `plan --validate` show too), and on rank 0 the planner's prediction beside it."""
    t = job.cfg.train
    which = f"median, without {steady.warmup} warm-up steps" if steady.warmup else "median of all steps"
    peak_mem, mfu = peak_mem_bytes(rt.device), math.nan if steady.mfu is None else steady.mfu  # None: no step here
    done = row.get("step", t.steps)  # fewer where data.repeat=false ended the run at the end of a corpus
    summary = {"steps": t.steps if done == t.steps else f"{done} of {t.steps} (a corpus ran out, data.repeat=false)",
               "final loss": row.get("loss"), "eval loss": eval_loss, "tokens": tokens_seen,
               "time (s)": elapsed, f"tokens/s ({which})": steady.tokens_per_s,
               "step time (s, same steps)": steady.step_time_s,
               f"MFU (model FLOPs, same steps, vs {peak.label})": mfu,
               "params": param_counts(job.model).total, "attention": pm.attention,
               "ranks": rt.world_size, "peak memory (GiB, rank 0)": peak_mem / 2**30}
    if plan is not None:
        summary.update(plan.summary_rows(steady.step_time_s, mfu, peak_mem))
    if job.cfg.model.init_from:
        summary["started from"] = job.cfg.model.init_from
    if drawn := row.get("tokens_by_source"):  # a mixture: each corpus's share of the training tokens
        summary["tokens by source"] = ", ".join(f"{k} {v / max(1, sum(drawn.values())):.1%}" for k, v in drawn.items())
    return {**summary, "output": str(out)}


SAMPLE_MAX_BYTES = 2e9


def show_sample(model_dir: Path, tokenizer, n_tokens: int, seed: int, prompt: str) -> None:
    """Sample from the weights just written, on rank 0's CPU: a whole model in one process, so only
    for models up to SAMPLE_MAX_BYTES (larger ones would not fit beside training, or take too long)."""
    from shoal.checkpoint.weights import load_weights
    from shoal.rundir.names import MODEL_WEIGHTS
    from shoal.train.generate import sample

    size = (model_dir / MODEL_WEIGHTS).stat().st_size
    if size > SAMPLE_MAX_BYTES:
        print(f"sample skipped: the model is {size / 1e9:.1f} GB (over {SAMPLE_MAX_BYTES / 1e9:.0f} GB); "
              f"run `shoal generate {model_dir.parent}` instead", file=sys.stderr)
        return
    model, _, _ = load_weights(model_dir)
    ids = sample(model, tokenizer.encode(prompt), n_tokens, seed=seed, stop_id=tokenizer.eos_id)
    print("sample:\n" + prompt + tokenizer.decode(ids))
