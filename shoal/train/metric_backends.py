"""Copies of each metrics row for TensorBoard and Weights & Biases (config: [metrics]).

metrics.jsonl stays the source of truth (every reader in shoal reads it); these are views of it for
the tools people already watch. Rank 0 writes them from the row it logs, so a per-rank number
(`memory_by_rank`, gathered onto rank 0) becomes one series per rank: `memory/peak/rank1`.

Resuming: the trainer drops rows past the checkpoint from metrics.jsonl (metrics.truncate_metrics);
TensorBoard is told the same with `purge_step` (its reader discards the earlier attempt's events
from that step on), and W&B continues the run whose id the first start kept in <out>/wandb.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from shoal.errors import UserError, first_line
from shoal.rundir.names import TENSORBOARD, WANDB, WANDB_RUN_ID


def scalars(row: dict) -> dict[str, float]:
    """The numbers of one metrics row under the names the backends show: top-level numbers as they
    are (loss, lr, grad_norm, tokens_per_s, ...), tables as `table/key`, per-rank lists as
    `memory/<kind>/rank<N>`; the step itself and what was not measured (None) left out."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "step":
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
        elif key == "memory_by_rank" and isinstance(value, dict):
            for kind, per_rank in value.items():
                out.update({f"memory/{kind}/rank{r}": float(v) for r, v in enumerate(per_rank) if v is not None})
        elif isinstance(value, dict):
            out.update({f"{key}/{k}": float(v) for k, v in value.items() if isinstance(v, (int, float))})
    return out


class TensorBoardBackend:
    """Event files under <out>/tensorboard (`tensorboard --logdir <out>`)."""

    def __init__(self, out: Path, start: int):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run re-does the steps after its checkpoint; TensorBoard's reader
        # drops what the earlier attempt wrote from there on, as metrics.jsonl does.
        self._writer = SummaryWriter(str(out / TENSORBOARD), purge_step=start + 1 if start else None)

    def write(self, row: dict) -> None:
        for name, value in scalars(row).items():
            self._writer.add_scalar(name, value, row["step"])

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbBackend:
    """A W&B run (offline: files under <out>/wandb, synced later with `wandb sync`; online: to the
    user's account). Its id is kept in <out>/wandb/shoal_run_id, so a restart continues the run."""

    def __init__(self, out: Path, mode: str, project: str, config: dict):
        import wandb

        folder = out / WANDB
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / WANDB_RUN_ID
        run_id = id_file.read_text().strip() if id_file.is_file() else ""
        if not run_id:
            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id + "\n")
        # The W&B process prints a banner and asks nothing (no login prompt in offline mode).
        os.environ.setdefault("WANDB_SILENT", "true")
        # console="off": W&B would otherwise wrap this process's stdout and stderr to copy them.
        self._run = wandb.init(project=project, id=run_id, resume="allow", mode=mode, dir=str(out),
                               name=out.resolve().name, config=config,
                               settings=wandb.Settings(console="off", save_code=False, disable_git=True))

    def write(self, row: dict) -> None:
        self._run.log(scalars(row), step=row["step"])

    def flush(self) -> None:
        pass  # W&B writes as it goes; finish() flushes

    def close(self) -> None:
        self._run.finish()


def open_backends(metrics_cfg, out: Path, start: int, config: dict) -> list:
    """The backends [metrics] asks for (none by default). Rank 0 only; the libraries were checked
    to be installed before any process started (rundir/observability.metrics_backend_problems). One that cannot
    start (an unwritable folder, W&B refusing the login) stops the run with one line naming it."""
    backends: list = []
    wanted = [("metrics.tensorboard", metrics_cfg.tensorboard, lambda: TensorBoardBackend(out, start)),
              ("metrics.wandb", metrics_cfg.wandb, lambda: WandbBackend(out, metrics_cfg.wandb,
                                                                        metrics_cfg.wandb_project, config))]
    for field, value, start_backend in wanted:
        if not value:
            continue
        try:
            backends.append(start_backend())
        except Exception as e:  # the libraries' own errors, of many types
            for backend in backends:
                backend.close()
            raise UserError(field, value, f"could not start ({type(e).__name__}: {first_line(e)}); "
                                          f"fix that, or turn {field} off") from None
    return backends
