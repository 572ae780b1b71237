"""Loss parity: train the same model on the same data with one process and with each layout.

All layouts run inside one launch of N workers (forming a process group costs seconds per
worker), each with fresh meshes; the single-process reference runs in the launching process with
the workers' thread count (one), since a different thread count changes how sums are split.

A layout passes when, at every step, its loss and its gradient norm match the reference's and,
at the end, every trained weight does, each within `tolerance`, and nothing is NaN or infinite.
The loss alone is not enough: AdamW is invariant to the scale of the gradient, so summing instead
of averaging gradients over two ranks leaves the loss within 5e-7 for 10 steps while the gradient
norm is off by exactly 2x.

Layouts and references compute in float64 (`in_float64`). In fp32 a layout rounds differently from
one process (gradients summed in another order; an expert multiplies the tokens of all ep ranks in
one matrix product) and training amplifies that: AdamW's first steps turn a 1e-10 difference in a
gradient near its eps into a 1e-6 difference in the weight, and a loss spike grows it a
thousandfold. Over 10 steps on 4 ranks tiny-moe's gradient norm ended 5.6e-5 off on plain FSDP and
3.4e-4 to 6.6e-4 off under expert parallelism, past the 1e-4 tolerance with no bug anywhere: every
gradient of the first step within 3.2e-7, no expert choice flipped before the drift (ep x FSDP:
none in 10 steps), and in float64 the same layouts within 1.2e-13. Float64 leaves the tolerance
nine orders above rounding, so a layout that exceeds it computes something else. The code is the
one that trains; only the default dtype differs (docs/parallelism.md has the measurements).
"""

from __future__ import annotations

import json
import math
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shoal.config import JobConfig, load_config
from shoal.errors import UserError
from shoal.job import resolve
from shoal.rundir.metrics import read_rows
from shoal.rundir.names import MODEL, MODEL_WEIGHTS
from shoal.worker.exit import exit_worker

OUT_DIRS = ("reference-*", "layout*")
"""The runs verify keeps in --out (reference-K, layoutN): an earlier verify's are removed first, and
a folder holding anything else is refused."""

# Layouts tried by default; each is "key=value,..." over parallel.* fields, plus model=PRESET and
# section.key=value for anything else. N stands for the number of ranks.
CANDIDATES = [
    "dp_shard=N,zero=3", "dp_shard=N,zero=2", "dp_shard=N,zero=1", "dp_replicate=N,dp_shard=1,zero=0",
    "dp_replicate=2,dp_shard=N/2,zero=3", "tp=2,dp_shard=N/2", "tp=2,dp_shard=N/2,sequence_parallel=false",
    "tp=2,dp_shard=N/2,model.n_kv_heads=1,model.tie_embeddings=true",  # more ranks than kv heads; one weight
    "pp=2,dp_shard=N/2,pp_schedule=1f1b", "pp=2,dp_shard=N/2,pp_schedule=gpipe",
    "pp=2,dp_shard=N/2,pp_schedule=interleaved-1f1b", "pp=2,dp_shard=N/2,pp_schedule=zero-bubble",
    "pp=2,dp_shard=N/2,zero=1",
    "tp=2,pp=N/2,dp_shard=1", "tp=2,pp=2,dp_shard=N/4", "model=debug-moe,dp_shard=N,zero=3",
    "model=debug-moe,ep=2,dp_shard=N,zero=3", "model=debug-moe,ep=N,dp_shard=N,zero=2",
    "model=debug-moe,ep=2,pp=2,dp_shard=N/2",
    # context parallel: alone (cp=N), with FSDP over dp_shard x cp, with tp, with pp
    "cp=N,dp_shard=1", "cp=2,dp_shard=N/2", "cp=2,tp=2,dp_shard=N/4", "cp=2,pp=2,dp_shard=N/4",
]


def base_overrides(steps: int, global_batch: int) -> list[str]:
    # lr 1e-3 after 2 warmup steps: a 1% learning-rate change then moves the loss by 1.7e-3 within
    # 3 steps (debug, 2 ranks), 17x the tolerance (tests/dist/test_parity.py injects other bugs).
    return ["model.preset=debug", f"train.steps={steps}", "train.micro_batch=2", f"train.global_batch={global_batch}",
            "train.seq_len=64", "train.lr=1e-3", f"train.warmup_steps={min(2, steps)}", "train.eval_every=0",
            "train.eval_batches=1", "train.sample_tokens=0"]


def ranks_problem(layout: str, nproc: int) -> str | None:
    """Why `layout` cannot run on nproc ranks by its N/k parts alone, or None: N/k is a whole count
    of at least one rank only on a multiple of k ranks (N/4 on 2 ranks read as dp_shard=0)."""
    parts = [int(k) for k in re.findall(r"N/(\d+)", layout)]
    if 0 in parts:
        return "N/0 is no number of ranks"
    need = max(parts, default=1)
    if nproc % need == 0:
        return None
    return f"needs {need} ranks" if nproc < need else f"needs a multiple of {need} ranks"


def with_ranks(text: str, nproc: int) -> str:
    """N/k and N in a layout as rank counts (ranks_problem first: k divides nproc)."""
    return re.sub(r"N/(\d+)", lambda m: str(nproc // int(m.group(1))), text).replace("N", str(nproc))


def layout_overrides(layout: str, nproc: int) -> list[str]:
    if problem := ranks_problem(layout, nproc):
        raise UserError("--layouts", layout, f"{problem} (N/k splits the --nproc {nproc} ranks k ways); change "
                                             "--nproc or the layout")
    out, fields = [], set()
    for item in filter(None, (x.strip() for x in layout.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise UserError("--layouts", layout, "write layouts as key=value,... separated by ';'")
        value = with_ranks(value, nproc)
        # a bare key is a parallel.* field; section.key reaches any other field
        field = "model.preset" if key.strip() == "model" else key.strip() if "." in key else f"parallel.{key.strip()}"
        if field in fields:  # the last would win silently: which one was meant is a guess
            raise UserError("--layouts", layout, f"sets {field} twice; keep one")
        if field == "train.steps":  # the reference would run --steps steps and the layout these
            raise UserError("--layouts", layout, "train.steps is --steps here (the reference runs as many); "
                                                 "use --steps N")
        fields.add(field)
        out.append(f"{field}={value}")
    return out


def config_for(layout: str | None, nproc: int, steps: int, global_batch: int | None = None) -> JobConfig:
    """The run for one layout. Global batch 4 x nproc sequences gives every layout on nproc ranks
    at least two micro-batches per rank; the single-process reference passes the same batch."""
    extra = layout_overrides(layout, nproc) if layout else []
    return load_config(None, base_overrides(steps, global_batch or 4 * nproc) + extra)


HOW_NOT_WHAT = ("train.activation_checkpoint", "train.activation_offload", "train.compile", "train.memory_check")
"""The train.* fields that change how a step is computed, not what: a layout's are checked against the
plain one-process run, so its reference leaves them out. Not train.micro_batch: an MoE's load-balancing
loss is taken per micro-batch, so micro_batch=1 against the reference's 2 moved debug-moe by 1.6e-5
in the loss and 2.7e-3 in the weights (dp_shard=2, 3 steps) on any layout."""


def reference_of(layout: str, nproc: int) -> str:
    """The one-process run a layout is compared with: the same model, data and training (its preset and
    every model.*, data.* and train.* field the layout sets, e.g. data.document_mask, train.seq_len or
    train.precision, but not HOW_NOT_WHAT), on one rank. A reference without the layout's train.* fields
    trained something else: train.precision=bf16 was compared with a float64 run initialised from other
    random draws (0.11 in the loss on dp_shard=2, 3 steps), train.seq_len=32 with 64-token windows."""
    same = [o for o in layout_overrides(layout, nproc)
            if o.startswith(("model.", "data.", "train.")) and o.partition("=")[0] not in HOW_NOT_WHAT]
    return ",".join([*same, "dp_shard=1"])


@contextmanager
def in_float64(cfg: JobConfig):
    """Build and train an fp32 run in float64: torch's default dtype while it runs, so parameters,
    activations, optimizer state and collectives all carry float64 (the model's upcasts keep it,
    shoal/model/precision.py). A bf16 run is left as it is."""
    import torch

    if cfg.train.precision != "fp32":
        yield
        return
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def fitting_layouts(nproc: int, steps: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The default layouts valid on nproc ranks, and the others with the reason they do not fit."""
    keep, skipped, seen = [], [], set()
    for layout in CANDIDATES:
        if problem := ranks_problem(layout, nproc):
            skipped.append((layout, problem))
            continue
        resolved = ",".join(layout_overrides(layout, nproc))
        if resolved in seen:
            continue
        seen.add(resolved)
        try:
            resolve(config_for(layout, nproc, steps), nproc)
        except UserError as e:
            skipped.append((with_ranks(layout, nproc), str(e)))
            continue
        keep.append(layout)
    return keep, skipped


@dataclass
class Result:
    layout: str
    loss_diff: float
    """Largest |loss - reference loss| over the steps (inf when a run died, wrote too few rows or a
    value is not finite)."""
    grad_diff: float
    """Largest |grad_norm - reference| / max(1, |reference|) over the steps."""
    weight_diff: float
    """Largest |weight - reference weight| over every element of the final model."""
    final_loss: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return max(self.loss_diff, self.grad_diff, self.weight_diff) <= self.tolerance


def _worst(pairs, scale=lambda ref: 1.0) -> float:
    """Largest difference, or inf if any value is missing or not finite (max() would drop a NaN)."""
    worst = 0.0
    for got, ref in pairs:
        if got is None or ref is None or not (math.isfinite(got) and math.isfinite(ref)):
            return math.inf
        worst = max(worst, abs(got - ref) / scale(ref))
    return worst


def weight_diff(got_dir: Path, ref_dir: Path) -> float:
    """Largest elementwise difference between two runs' final weights (inf if missing or not finite)."""
    from safetensors import safe_open

    try:
        with safe_open(str(got_dir / MODEL_WEIGHTS), "pt") as got, safe_open(str(ref_dir / MODEL_WEIGHTS), "pt") as ref:
            if set(got.keys()) != set(ref.keys()):
                return math.inf
            worst = 0.0
            for name in ref.keys():  # one tensor at a time
                a, b = got.get_tensor(name).double(), ref.get_tensor(name).double()
                if a.shape != b.shape or not bool(a.isfinite().all() and b.isfinite().all()):
                    return math.inf
                worst = max(worst, float((a - b).abs().max()) if a.numel() else 0.0)
            return worst
    except (OSError, RuntimeError, ValueError):  # a run that died wrote no (or half a) model
        return math.inf


def compare(layout: str, got: Path, ref: Path, tolerance: float) -> Result:
    """One layout's run directory against the reference run's."""
    g, r = read_rows(got), read_rows(ref)
    complete = len(g) == len(r) > 0
    loss = _worst([(a.get("loss"), b.get("loss")) for a, b in zip(g, r)]) if complete else math.inf
    grad = (_worst([(a.get("grad_norm"), b.get("grad_norm")) for a, b in zip(g, r)], lambda ref: max(1.0, abs(ref)))
            if complete else math.inf)
    weights = weight_diff(got / MODEL, ref / MODEL)
    return Result(layout, loss, grad, weights, g[-1]["loss"] if g else math.nan, tolerance)


def worker(out: str, layouts: list[str], nproc: int, steps: int) -> None:
    """Runs inside each of the N workers: every layout in turn, in one process group."""
    from shoal.train.trainer import train

    for i, layout in enumerate(layouts):
        cfg = config_for(layout, nproc, steps)
        with in_float64(cfg):
            train(cfg, Path(out) / f"layout{i}", show=False, keep_process_group=True)
    from shoal.train.distributed import shutdown

    shutdown()


if __name__ == "__main__":
    out, nproc, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    worker(out, json.loads(sys.argv[4]), nproc, steps)
    exit_worker(0)
