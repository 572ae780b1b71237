"""A job: the config resolved once for a world size, then only read.

`resolve(cfg, world)` fills what the config leaves open (dp_shard=-1, micro_batch=0), builds the
model config and the layout, and checks the layout with shoal.layout's rules. The process that
prepares a run does it before any worker starts (so every mistake is one line there) and writes
the job to <out>/job.json (`Job.save`); the workers it starts read it back (`load_job`) and pass
the frozen Job down instead of re-deriving pieces of it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from shoal.config import JobConfig, config_from_sections
from shoal.errors import UserError
from shoal.files import write_json
from shoal.layout import MAX_GPUS, Layout
from shoal.layout_rules import check, factorizations
from shoal.model.config import ModelConfig
from shoal.rundir.disk import no_space_left


@dataclass(frozen=True)
class Job:
    cfg: JobConfig
    """The sections as loaded (train, data, checkpoint, debug are read from here)."""
    model: ModelConfig
    layout: Layout
    world: int

    @property
    def n_microbatches(self) -> int:
        return self.layout.microbatches(self.cfg.train.global_batch)

    def save(self, path: Path, **how) -> Path:
        """Write the job to `path` (a run's job.json) with how to run it (`how`: out, resume, show);
        under a name of its own first, then renamed into place, so that several nodes' launchers
        writing one shared folder never leave half a file."""
        record = {"shoal_job": 1, "config": self.cfg.to_dict(), "world": self.world,
                  "layout": dataclasses.asdict(self.layout), "model": dataclasses.asdict(self.model),
                  **{k: str(v) if isinstance(v, Path) else v for k, v in how.items()}}
        with no_space_left(path):
            write_json(path, record, durable=False)
        return path


def load_job(path: Path) -> tuple[Job, dict]:
    """A job.json back: the Job as it was resolved (not resolved again), and how to run it."""
    try:
        record = json.loads(Path(path).read_text())
        cfg = config_from_sections(record.pop("config"))
        layout, world = Layout(**record.pop("layout")), record.pop("world")
        record.pop("model", None), record.pop("shoal_job")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError) as e:
        why = str(e) if isinstance(e, UserError) else type(e).__name__
        raise UserError("--job", str(path), f"is not a job.json that shoal wrote ({why}); start the run with "
                                            "`shoal train` or `torchrun -m shoal.train RECIPE --out DIR`") from None
    return Job(cfg, cfg.model_config(), layout, world), record


def resolve_layout(cfg: JobConfig, world: int) -> Layout:
    """The config's layout on `world` ranks, with dp_shard=-1 and micro_batch=0 filled in."""
    par, t = cfg.parallel, cfg.train
    fixed = par.dp_replicate * par.tp * par.pp * par.cp
    dp_shard = par.dp_shard
    if dp_shard == -1:
        if fixed < 1 or world % fixed:
            raise UserError("parallel", f"dp_replicate*tp*pp*cp={fixed}",
                            f"does not divide the world size {world}; options: {factorizations(world)}")
        dp_shard = world // fixed
    micro_batch = t.micro_batch or auto_micro_batch(t.global_batch, par.dp_replicate * dp_shard, par.pp,
                                                    par.pp_schedule)
    return Layout(dp_replicate=par.dp_replicate, dp_shard=dp_shard, tp=par.tp, cp=par.cp, pp=par.pp, ep=par.ep,
                  expert_tp=par.expert_tp, zero=par.zero,
                  micro_batch=micro_batch, pp_schedule=par.pp_schedule, pp_microbatches=par.pp_microbatches,
                  pp_virtual_stages=par.pp_virtual_stages, activation_checkpoint=t.activation_checkpoint,
                  sequence_parallel=par.sequence_parallel, grad_compression=par.grad_compression,
                  diloco_inner_steps=par.diloco_inner_steps, rank_order=par.rank_order,
                  offload=par.offload, activation_offload=t.activation_offload)


def auto_micro_batch(global_batch: int, dp: int, pp: int, schedule: str) -> int:
    """train.micro_batch=0: each data-parallel rank takes its share of the batch in one micro-batch
    (no accumulation), or in pp micro-batches (rounded up to a multiple of pp) when pipelining, so
    changing only --nproc keeps the same global batch and therefore the same training."""
    if dp < 1 or global_batch % dp:
        return 1  # the batch rule then names train.global_batch with a fix
    per_rank = global_batch // dp
    if pp <= 1:
        return per_rank
    # The fewest micro-batches that fill the pipeline: at least pp, a multiple of pp when the
    # schedule interleaves, and dividing the rank's share.
    for n in range(pp, per_rank + 1):
        if per_rank % n == 0 and (n % pp == 0 or schedule in ("gpipe", "1f1b")):
            return per_rank // n
    return 1


def resolve(cfg: JobConfig, world: int) -> Job:
    """Resolve and check the whole job for `world` ranks (raises the first UserError)."""
    if world < 1:
        raise UserError("world size", world, "must be a positive integer")
    if world > MAX_GPUS:  # before the batch rules, whose fixes would name a batch of that many ranks
        raise UserError("world size", world, f"is more than {MAX_GPUS:,} ranks (a typo?); check --nodes and "
                                             "--gpus-per-node")
    model = cfg.model_config()
    layout = resolve_layout(cfg, world)
    check(layout, model, world, cfg.train.global_batch, cfg.train.seq_len)
    return Job(cfg, model, layout, world)

