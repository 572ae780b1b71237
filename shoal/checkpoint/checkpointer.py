"""The trainer's checkpointing: resume before the loop, save every `checkpoint.every` steps.

A save is collective. Every rank hands its share of the state (see state.py) to
torch.distributed.checkpoint, which writes one file per rank into <root>/.partial-step_N; each
rank hashes its own file as it writes it; rank 0 gathers the hashes and commits the directory (store.py). With
`checkpoint.async`, the state is first copied to host memory (the only part training waits for)
and a background thread writes, hashes and commits it, talking over its own gloo process group
so its collectives never interleave with training's.

Resuming, rank 0 picks the newest intact checkpoint (or the one named by --resume) and tells the
others; every rank then loads its share by parameter name, whatever layout wrote it. The tensor
shards' checksums are checked while they are read (the ranks split the files), and nothing read is
applied until every rank has found its share intact; a damaged checkpoint falls back as before.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from shoal.checkpoint import state as ckpt_state
from shoal.checkpoint import store
from shoal.checkpoint.choose import (check_not_finished, check_same_model, checkpoint_root, choose_checkpoint,
                                    model_fields, restart_count, run_mark)
from shoal.checkpoint.hashing_writer import hashing_writer
from shoal.checkpoint.mapped_read import MappedReader
from shoal.checkpoint.safe_read import TensorsOnlyLoadPlanner, UnsafeCheckpoint, read_metadata
from shoal.config import JobConfig
from shoal.data.tokenizer_files import TOKENIZER_FILES, copy_tokenizer
from shoal.errors import UserError
from shoal.parallel.replicas import replica_place
from shoal.rundir.disk import DiskFull, errors_within, no_space_left
from shoal.rundir.metrics import last_logged_step, truncate_metrics
from shoal.rundir.names import MODEL, step_dir_name

# DCP warns on every single-process save and load; that is the intent here, not a mistake.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class Checkpointer:
    """One per `train()`: `resume()` before the loop, `maybe_save(step)` after each step, `close()` at the end."""

    def __init__(self, cfg: JobConfig, out: Path, rt, pm, optimizer, loader, resume: str = "auto"):
        c = cfg.checkpoint
        self.cfg, self.out, self.rt, self.pm, self.optimizer, self.loader = cfg, Path(out), rt, pm, optimizer, loader
        self.root, self.resume_from = checkpoint_root(cfg, out), resume
        self.every, self.keep, self.total = c.every, c.keep, cfg.train.steps
        self._pending: Future | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shoal-ckpt") if c.async_save and c.every else None
        self._stager = _host_stager() if self._pool else None
        # Deleting old checkpoints takes a while (0.17 s for 828 MB here) and training needs none of
        # it: rank 0 prunes in the background, and the next save waits for it (never two at once).
        self._pruner = ThreadPoolExecutor(1, thread_name_prefix="shoal-prune") if rt.is_main and c.every else None
        self._pruning: Future | None = None
        if rt.is_main:
            store.remove_partials(self.root)  # before any rank can start a save: new_group below waits for all
        # Checkpoint collectives get their own gloo group: a background save must not interleave with
        # training's collectives, and gloo moves the small plan objects on any device.
        # (Also without checkpoint.every: a SIGTERM still saves, see shoal/train/preempt.py.)
        self.pg = dist.new_group(backend="gloo") if rt.world_size > 1 else None

    # ------------------------------------------------------------------------------------------
    # Resume

    def resume(self) -> int:
        """Load the chosen checkpoint, if any; returns the number of steps already done."""
        # Rank 0 checks everything but the tensor shards' checksums; the ranks split those, each
        # hashing its files as it reads them (MappedReader): one pass over the bytes, not two.
        path = self._agree(lambda: choose_checkpoint(self.resume_from, self.root, data_checksums=False))
        if path is not None and not self._load(path, verify=True):
            # Damaged after all: choose again with every checksum, which names the damage and falls
            # back to the previous checkpoint (or refuses, for an explicit --resume PATH).
            path = self._agree(lambda: choose_checkpoint(self.resume_from, self.root))
            if path is not None:
                self._load(path, verify=False)
        if path is None:
            if restart_count() and self.rt.is_main and replica_place() is None:  # a replica group heals from a peer
                lost = last_logged_step(self.out)
                store.warn(f"elastic restart {restart_count()} of {os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')}: "
                           f"no checkpoint yet, starting over; the failed attempt had reached step {lost}, "
                           f"so {_steps(lost)} lost")
            return 0
        train_state = store.read_train_state(path)
        if self.pm.loss_scaler is not None and "loss_scale" in train_state:  # fp16: the scale goes on as it was
            self.pm.loss_scaler.load_state_dict(train_state["loss_scale"])
        changed = self.loader.load_state_dict(train_state["data"]) or self._other_tokens(train_state)
        if changed and self.rt.is_main:  # one line, once (a warnings.warn printed its source line on every rank)
            store.warn(f"warning: {changed}")
        step = int(train_state["step"])
        if self.rt.is_main:
            self._report_resume(path, step, train_state)
        return step

    def _load(self, path: Path, verify: bool) -> bool:
        """Read the checkpoint at path into the model and optimizer. verify: hash this rank's share of
        the tensor shards while reading them, and apply nothing (return False) if any rank found one
        damaged."""
        train_state = store.read_train_state(path)
        check_same_model(train_state["model"], self.cfg, path)
        share, algorithm = store.data_share(path, self.rt.rank, self.rt.world_size) if verify else ([], store.HASH)
        reader = MappedReader(path, hash_as_read=share, algorithm=algorithm)
        failure = None
        try:
            metadata = read_metadata(path)
            check_not_finished(int(train_state["step"]), self.total, path, self.root, self.out)  # before the long load
            saved = {k: v for k, v in metadata.state_dict_metadata.items() if hasattr(v, "size")}
            targets = ckpt_state.load_targets(self.pm.modules, self.optimizer, self.rt.rank, saved,
                                              self.pm.grad_compressor, self.pm.diloco)
            dcp.load(targets, storage_reader=reader, planner=TensorsOnlyLoadPlanner(),
                     process_group=self.pg, no_dist=self.rt.world_size == 1)
        except UnsafeCheckpoint as e:
            raise UserError("--resume", str(path), f"refused: {e}") from None
        except UserError:
            raise
        except (Exception, CheckpointException) as e:  # damaged bytes can fail the read itself (DCP wraps
            # the error in a BaseException of its own, e.g. a shard's zip header garbled): the checksums decide below
            if not verify:
                raise
            failure = e
        if verify and self._any_rank(bool(store.verify_share(path, self.rt.rank, self.rt.world_size, reader.hashed))):
            return False
        if failure is not None:
            raise failure
        ckpt_state.apply(self.pm.modules, self.optimizer, targets, self.pm.grad_compressor, self.pm.diloco)
        return True

    def _any_rank(self, flag: bool) -> bool:
        if self.rt.world_size == 1:
            return flag
        votes = torch.tensor([int(flag)])
        dist.all_reduce(votes, group=self.pg)
        return bool(votes.item())

    def _agree(self, choose):
        """Rank 0 chooses (reading and verifying files); every rank gets the same answer or error."""
        answer = None
        if self.rt.is_main:
            try:
                chosen = choose()
                answer = ("ok", str(chosen) if chosen is not None else None)
            except UserError as e:
                answer = ("error", (e.field, e.value, e.fix))
            except Exception as e:  # tell the others before failing, rather than leave them waiting
                answer = ("crash", f"{type(e).__name__}: {e}")
                if self.rt.world_size == 1:
                    raise
        if self.rt.world_size > 1:
            box = [answer]
            dist.broadcast_object_list(box, src=0, group=self.pg)
            answer = box[0]
        if answer[0] == "error":
            raise UserError(*answer[1])
        if answer[0] == "crash":
            raise RuntimeError(f"choosing a checkpoint failed on rank 0: {answer[1]}")
        return Path(answer[1]) if answer[1] is not None else None

    def _tokens(self) -> str:
        """The tokens the run trains on: each corpus's fingerprint (its tokenizer and every shard's
        checksum, shoal/data/dataset.py), so it tells a changed corpus or tokenizer even where the
        sequence count stays the same."""
        return self.loader.identity()

    def _other_tokens(self, train_state: dict) -> str | None:
        saved, now = train_state.get("tokens"), self._tokens()
        if not saved or not now or saved == now:  # checkpoints from before it was recorded say nothing
            return None
        data = train_state.get("config", {}).get("data", {})
        was = ", ".join(f"{k}={data[k]}" for k in ("path", "tokenizer") if k in data)
        return (f"the checkpoint was trained on other tokens ({was}: {saved}, now {now}): the corpus or the "
                "tokenizer changed, so batches after resume differ from the original run (another tokenizer's ids "
                "mean other text to the model)")

    def _report_resume(self, path: Path, step: int, train_state: dict) -> None:
        reached = last_logged_step(self.out)
        truncate_metrics(self.out, step)
        before = train_state.get("layout", {})
        now = layout_info(self.cfg, self.rt)
        resharded = "" if before == now else f", resharded from {layout_text(before)} to {layout_text(now)}"
        if restart_count():
            store.warn(f"elastic restart {restart_count()} of {os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')}: "
                       f"resuming from step {step} ({path}){resharded}; the failed attempt had reached step "
                       f"{reached}, so {_steps(max(0, reached - step))} lost")
        elif step == self.total:  # stopped during the final export (check_not_finished)
            store.warn(f"resuming from step {step} ({path}){resharded}: every step is done, so this run only "
                       f"writes the final model, {self.out / MODEL}")
        else:
            store.warn(f"resuming from step {step} ({path}){resharded}")

    # ------------------------------------------------------------------------------------------
    # Save

    def path_of(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def due(self, step: int) -> bool:
        return bool(self.every) and (step % self.every == 0 or step == self.total)

    def maybe_save(self, step: int, loss: float | None = None, *, stopping: bool = False) -> None:
        """After `step` optimizer steps: save if one is due (in the background with checkpoint.async).
        stopping: the process exits next (SIGTERM), so save now, due or not, and commit before returning."""
        if not (self.due(step) or stopping):
            return
        self.wait()  # one save in flight at a time
        live = ckpt_state.capture(self.pm.modules, self.optimizer, self.rt.rank, self.pm.grad_compressor,
                                  self.pm.diloco)
        info = self._train_state(step, loss)
        if self._pool is None or stopping:
            self._write(live, step, info)
        else:
            staged = self._stager.stage(live)  # a private copy: training goes on changing the live tensors
            self._pending = self._pool.submit(self._write, staged, step, info)

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed and old ones are pruned; re-raises its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
        if self._pruning is not None:  # started by the save just waited for, in its thread
            pruning, self._pruning = self._pruning, None
            pruning.result()

    def close(self) -> None:
        self.wait()
        if self._pruner is not None:
            self._pruner.shutdown(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._stager.close()

    def _train_state(self, step: int, loss: float | None) -> dict:
        return {"step": step, "loss": loss, "data": self.loader.state_dict(), "tokens": self._tokens(),
                "run": run_mark(self.root, self.out),
                "model": model_fields(self.cfg), "layout": layout_info(self.cfg, self.rt),
                "config": self.cfg.to_dict(), "torch": torch.__version__, "time": time.time(),
                **({"loss_scale": self.pm.loss_scaler.state_dict()} if self.pm.loss_scaler is not None else {})}

    def _write(self, state: dict, step: int, info: dict) -> None:
        """Collective: write, hash, and (rank 0) commit one checkpoint."""
        partial = self.root / (store.PARTIAL + step_dir_name(step))
        try:
            with no_space_left(partial, kept="the checkpoints before it are intact; ",
                               then=", or set checkpoint.dir or --out on another disk"):
                self._write_and_commit(partial, state, step, info)
        except DiskFull:
            if self.rt.is_main:  # give the space back: a partial save is never loaded
                shutil.rmtree(partial, ignore_errors=True)
            raise
        except BaseException as e:  # DCP's CheckpointException is one
            if partial.is_dir() or not any(isinstance(err, FileNotFoundError) for err in errors_within(e)):
                raise
            raise UserError("checkpoint.dir", str(self.root), f"{partial} was removed while step {step} was being "
                            "saved, by something other than this run; leave the checkpoint folder alone while a run "
                            "writes it (the same command resumes from the newest checkpoint left, if any)") from None

    def _write_and_commit(self, partial: Path, state: dict, step: int, info: dict) -> None:
        mine: dict[str, dict] = {}  # this rank's shard files, hashed as they are written
        dcp.save(state, storage_writer=hashing_writer(partial, mine), process_group=self.pg,
                 no_dist=self.rt.world_size == 1)
        if self.rt.is_main:
            store.write_json(partial / store.TRAIN_STATE, info)
            copy_tokenizer(self.cfg.data.tokenizer, partial)  # an export of this step names its tokens
            for name in (".metadata", store.TRAIN_STATE) + tuple(n for n in TOKENIZER_FILES if (partial / n).is_file()):
                mine[name] = store.digest(partial / name)
        everyone = [mine]
        if self.pg is not None:
            everyone = [None] * self.rt.world_size if self.rt.is_main else None
            dist.gather_object(mine, everyone, dst=0, group=self.pg)
        if self.rt.is_main:  # every rank's shard is on disk and hashed: commit
            files = {name: d for part in everyone for name, d in part.items()}
            store.commit(partial, self.root / step_dir_name(step), files,
                         {"step": step, "world_size": self.rt.world_size, "layout": info["layout"]})
            self._pruning = self._pruner.submit(store.prune, self.root, self.keep) if self._pruner else None
            if self._pruning is None:  # a SIGTERM save without checkpoint.every
                store.prune(self.root, self.keep)


def _host_stager():
    return _HostStager()


class _HostStager:
    """Copies the state to host memory (pinned on CUDA) for the background thread to write. It keeps
    its buffers from one save to the next, so later saves only copy (no allocation, no page faults).

    torch 2.11's DefaultStager empties its copy table at the end of every stage (staging.py: _stage
    calls close()), so its second stage raises KeyError: <class 'type'> (seen on an H200; 2.13 keeps
    it). Where a probe shows that, each save gets a fresh stager and pays the allocation again."""

    def __init__(self):
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        options = StagingOptions(use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False,
                                 use_async_staging=False, use_non_blocking_copy=False)
        self._new = lambda: DefaultStager(options)
        self._stager = self._new()
        self._reusable = _stages_twice(self._new())

    def stage(self, state: dict) -> dict:
        if not self._reusable:
            self._stager.close()
            self._stager = self._new()
        return self._stager.stage(state)

    def close(self) -> None:
        self._stager.close()


def _stages_twice(stager) -> bool:
    try:
        for _ in range(2):
            stager.stage({"probe": {"x": torch.zeros(1)}})
        return True
    except KeyError:
        return False
    finally:
        stager.close()


def layout_info(cfg: JobConfig, rt) -> dict:
    d = rt.dims
    return {"world_size": rt.world_size, "dp_replicate": d.dp_replicate, "dp_shard": d.dp_shard, "tp": d.tp,
            "pp": d.pp, "ep": d.ep, "zero": cfg.parallel.zero,
            "pp_schedule": cfg.parallel.pp_schedule if d.pp > 1 else None}


def _steps(n: int) -> str:
    return f"{n} step is" if n == 1 else f"{n} steps are"


def layout_text(layout: dict, zero: bool = False) -> str:
    """A checkpoint's layout (layout_info) in words: "1 rank", "4 ranks (dp_shard=2 x tp=2)"; `zero`
    adds the ZeRO stage where data parallelism could shard."""
    if not layout or not isinstance(layout, dict):  # none recorded, or a damaged train_state.json
        return "?"
    parts = [f"{k}={layout[k]}" for k in ("dp_replicate", "dp_shard", "tp", "pp", "ep") if layout.get(k, 1) != 1]
    if zero and layout.get("zero") is not None and layout.get("dp_shard", 1) * layout.get("dp_replicate", 1) > 1:
        parts.append(f"zero={layout['zero']}")
    n = layout.get("world_size", "?")
    return f"{n} rank{'s' if n != 1 else ''}" + (f" ({' x '.join(parts)})" if parts else "")
