"""The job config: one typed dataclass per section, loaded from TOML and `--set section.key=value`.

Every field has a docstring (printed by `shoal config`); every check a user can fail happens in
`JobConfig.validate` (or, for the one that depends on which value was written last, `load_config`),
before any worker process is spawned, and raises a UserError that names the field, the value and a fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from shoal.config_values import coerce, toml_float
from shoal.errors import UserError
from shoal.files import read_toml
from shoal.layout import ACTIVATION_CHECKPOINT, DEFAULT_RANK_ORDER, DILOCO_QUANTIZE
from shoal.setting_rules import slow_link_setting_problems
from shoal.model.config import ModelConfig, get_preset
from shoal.pretrained import model_folder_of, model_of, open_pretrained, take_the_folder
from shoal.rundir.folder import checkpoint_dir_problem
from shoal.rundir.observability import metrics_backend_problems, profile_ranks, profile_step_range, profile_steps_problem

# [model] takes a preset plus any ModelConfig field to override it; None means "the preset's value".
_MODEL_OVERRIDES = [f for f in fields(ModelConfig) if f.name != "note"]
ModelSection = dataclasses.make_dataclass(
    "ModelSection",
    [("preset", str, field(default="tiny")), ("init_from", str, field(default=""))]
    + [(f.name, Optional[f.type], field(default=None)) for f in _MODEL_OVERRIDES],
)
ModelSection.__doc__ = ("A model preset (`shoal presets`) or a pretrained folder to start from, and any ModelConfig "
                        "field that overrides it.")
INIT_FROM_DOC = ("A Hugging Face model folder (config.json + safetensors) or a shoal run's model/ to start from: its "
                 "shape, weights and tokenizer.json (unless data.tokenizer is given); the optimizer starts fresh "
                 "(--resume continues a run). docs/hf.md lists the families.")


PRECISIONS = ("fp32", "bf16", "bf16-params", "fp16", "fp8")  # see TrainConfig.precision
FP8_RECIPES = ("tensorwise", "rowwise")  # see TrainConfig.fp8_recipe


@dataclass
class ParallelConfig:
    """How the job is split across ranks. World size = dp_replicate * dp_shard * tp * pp * cp."""

    dp_replicate: int = 1
    """Data-parallel replicas (plain all-reduce across them; HSDP when dp_shard > 1 too)."""
    dp_shard: int = -1
    """Data-parallel ranks that shard state (ZeRO/FSDP); -1 takes whatever the world size leaves."""
    tp: int = 1
    """Tensor-parallel degree (innermost by default: neighbouring ranks)."""
    cp: int = 1
    """Context-parallel degree: each sequence is cut into 2*cp chunks, rank i keeping chunks i and 2*cp-1-i, and
    attention sees the other ranks' keys and values (parallel/context_parallel.py); just outside tp in the rank order."""
    pp: int = 1
    """Pipeline stages (outermost by default)."""
    ep: int = 1
    """Expert-parallel degree; borrows ranks from the data-parallel dimension."""
    expert_tp: int = 0
    """Tensor parallelism of the routed experts (Megatron-Core's expert_tensor_parallel_size, "ETP"): 0 splits them
    as the layout implies (tp ways where ep fits inside dp_shard, whole experts where the expert group folds over
    tp/cp ranks); another value re-partitions the tp*cp*dp_shard ranks into expert_tp x ep x expert-data-parallel
    groups (MoE parallel folding). Planned by shoal plan; shoal train splits experts as the layout implies."""
    zero: int = 3
    """ZeRO stage for the sharded data-parallel dimension: 0 replicate, 1 optimizer, 2 +gradients, 3 +parameters."""
    pp_schedule: str = "1f1b"
    """gpipe | 1f1b | interleaved-1f1b | zero-bubble (interleaved, backward split into input and weight grads) |
    dualpipe (DeepSeek-V3's bidirectional pipeline: planned by shoal plan, refused by shoal train)."""
    pp_microbatches: int = 0
    """Micro-batches per pipeline step; 0 uses the gradient-accumulation count."""
    pp_virtual_stages: int = 1
    """Stages per pipeline rank (interleaved schedules)."""
    pp_lighter_edges: int = 0
    """Layers moved off the first and last pipeline stages, which also run the embedding and the head."""
    sequence_parallel: bool = True
    """Shard norms and residuals along the sequence across the tensor-parallel group."""
    grad_compression: str = "none"
    """How gradients cross the data-parallel group: none (fp32 all-reduce) | bf16 (half the bytes) |
    int8 (per-chunk scales, ~4x fewer) | topk (largest values + error feedback) | powersgd (low-rank
    + error feedback). int8, topk and powersgd run on DDP layouts and on zero 2/3 without tp/pp/ep, where they
    compress HSDP's all-reduce across dp_replicate (topk and powersgd need dp_replicate > 1) and int8 also the
    reduce-scatter within dp_shard."""
    topk_density: float = 0.1
    """grad_compression=topk: share of each gradient bucket's values sent per step, in (0, 1]."""
    topk_warmup: int = 30
    """grad_compression=topk: steps reduced uncompressed first, so AdamW's second moments start from
    dense gradients (top-k 10% trailed plain by 7.5% without it, by 3.4% with 30: parallel/compression.py)."""
    powersgd_rank: int = 4
    """grad_compression=powersgd: rank of each gradient matrix's approximation (>= 1)."""
    powersgd_warmup: int = 10
    """grad_compression=powersgd: steps reduced uncompressed before compressing (PowerSGD's start iteration)."""
    diloco_inner_steps: int = 0
    """DiLoCo (H): each dp_replicate group trains this many steps on its own, then the groups average
    their progress in an outer step (shoal/parallel/diloco.py); 0 = off (gradients all-reduced every step)."""
    diloco_outer_lr: float = 0.7
    """DiLoCo: outer SGD learning rate on the averaged pseudo-gradient (1 with momentum 0 = plain averaging)."""
    diloco_outer_momentum: float = 0.9
    """DiLoCo: outer Nesterov momentum, in [0, 1) (0: plain SGD)."""
    diloco_fragments: int = 1
    """Streaming DiLoCo: parameters in this many fragments, synced on a staggered schedule (1 to H)."""
    diloco_quantize: str = "none"
    """DiLoCo: the pseudo-gradient on the wire: none (fp32) | bf16 | int8 | fp4 (4 bits: a sign and a power
    of two; int8 and fp4 with an fp32 scale per 256 values)."""
    diloco_overlap_steps: int = 0
    """Streaming DiLoCo's tau: a fragment's all-reduce runs beside this many inner steps before its
    outer step is applied, mixed half and half with what the group learnt meanwhile (0: applied at once)."""
    offload: str = "none"
    """What lives in host memory instead of the accelerator's: none | params (FSDP2's CPU offload
    policy: parameters, gradients and the optimizer step on the host; zero 2/3 with dp_shard > 1) |
    optimizer (optimizer state only; not built yet, refused). train.activation_offload moves activations."""
    rank_order: str = DEFAULT_RANK_ORDER
    """Which ranks form each group: tp, dp and pp from innermost (neighbouring ranks, one node) to
    outermost. Launchers give each node a block of neighbouring ranks, so tp-dp-pp keeps TP inside a
    node; dp-tp-pp puts DP there instead (for placement experiments; `shoal mesh --nnodes` shows it)."""


@dataclass
class TrainConfig:
    """Optimization and the training loop."""

    steps: int = 144
    """Optimizer steps."""
    seed: int = 0
    """Seeds model init, data order and dropout-free sampling; a CPU run with a seed is bitwise reproducible."""
    optimizer: str = "adamw"
    """adamw | sgd (plain SGD: no momentum, weight decay added to the gradient; DiLoCo's degenerate check)."""
    lr: float = 3e-3
    """Peak learning rate (AdamW)."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 20
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (not on norms)."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.95
    """AdamW second-moment decay."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables."""
    micro_batch: int = 0
    """Sequences per forward/backward on one rank; 0: global_batch / dp (no accumulation), split into
    pp micro-batches when pipelining, so changing only the rank count keeps the same training (of a dense
    model: an MoE's load-balancing loss is taken per micro-batch, so set it to keep an MoE's)."""
    global_batch: int = 16
    """Sequences per optimizer step over all data-parallel ranks (= micro_batch * accumulation * dp)."""
    seq_len: int = 256
    """Tokens per sequence."""
    precision: str = "fp32"
    """fp32; bf16: autocast over fp32 master weights and optimizer state, the same computation in every
    layout (FSDP gathers fp32 parameters); bf16-params: as bf16, and FSDP (zero 2/3) also gathers and
    computes with bf16 copies of the parameters (half the all-gather bytes; embedding, norms and head
    then run in bf16, so losses differ from 1 process by ~1e-3, not bitwise-comparable). Without FSDP
    bf16-params is bf16. fp16: autocast to float16 over fp32 master weights with dynamic loss scaling
    (train.loss_scale; a step whose gradients overflow is skipped and the scale halved, metrics count
    them). fp8: the transformer blocks' linear layers multiply in float8 through torchao
    (train.fp8_recipe; `pip install 'shoal[fp8]'`), everything else as bf16; emulated on CPU, refused on
    a GPU without FP8 tensor cores (compute capability below 8.9)."""
    fp8_recipe: str = "tensorwise"
    """precision=fp8: torchao's scaling: tensorwise (one scale per tensor, fastest) | rowwise (one per row
    of each operand, more accurate)."""
    loss_scale: float = 65536.0
    """precision=fp16: the first loss scale (dynamic: halved on every overflowing step, doubled after
    loss_scale_window steps without one)."""
    loss_scale_window: int = 2000
    """precision=fp16: steps without an overflow before the loss scale doubles."""
    activation_offload: bool = False
    """Keep the activations saved for backward in host memory (torch.autograd.graph.save_on_cpu, pinned
    on CUDA) and bring them back for backward: less accelerator memory, more PCIe traffic. Same results."""
    activation_checkpoint: str = "none"
    """none | selective (recompute all but matmul and attention outputs) | selective-op (torchtitan's
    per-op policy: selective, and every second matmul recomputed too) | full (recompute each layer)."""
    compile: bool = False
    """torch.compile each transformer block (inductor; on CPU it needs a C++ compiler and the first
    step spends tens of seconds compiling). Same losses as eager within float rounding."""
    memory_check: bool = True
    """Before starting, refuse a run whose predicted per-rank peak memory (the planner's model) exceeds
    the GPU's memory, or on CPU the host's available memory shared by the local ranks; false skips it."""
    eval_every: int = 48
    """Evaluate the held-out loss every this many steps (and at the end); 0 only at the end."""
    eval_batches: int = 4
    """Held-out batches (of global_batch sequences) per evaluation."""
    sample_prompt: str = "def "
    """The text the end-of-run sample continues."""
    sample_tokens: int = 200
    """Tokens of text generated at the end of a run (0: none)."""
    on_nonfinite: str = "stop"
    """A step whose loss or gradient norm is NaN or infinite: `stop` the run (exit code 3, nothing saved from it),
    or `skip` its update and go on (each skip is reported)."""


@dataclass
class DataConfig:
    """What to train on."""

    path: str = "stdlib"
    """`stdlib` (this Python's standard-library source), a folder made by `shoal data prepare`, or raw
    data: a file, a glob or a directory of text, JSONL, parquet or Arrow files, compressed or not
    (docs/data.md)."""
    mix: dict = field(default_factory=dict)
    """A weighted mixture instead of data.path: data paths and relative weights, e.g. `"web" = 0.7`
    and `"code" = 0.3` in the recipe's data.mix table."""
    tokenizer: str = "byte"
    """`byte`, or the path of a Hugging Face tokenizers JSON file."""
    text_field: str = "text"
    """The field holding the text in JSONL records, or the column in parquet and Arrow files."""
    cache_dir: str = ""
    """Where raw data paths are prepared on first use; empty: $SHOAL_CACHE_DIR/tokens or ~/.cache/shoal/tokens."""
    val_fraction: float = 0.01
    """Share of documents held out for the evaluation loss (chosen by a hash of their names)."""
    document_mask: bool = False
    """Attention stays inside each document of a packed sequence and positions restart at each one."""
    repeat: bool = True
    """A corpus that has given all its sequences starts another pass; false: the run ends there."""


@dataclass
class CheckpointConfig:
    """Saving and resuming."""

    every: int = 0
    """Save a sharded, resumable checkpoint every this many steps and at the last step; 0: none
    (the final model is written to <out>/model either way)."""
    dir: str = ""
    """Checkpoint root; empty: <out>/checkpoints. A relative path lies inside the output directory
    and may not leave it."""
    keep: int = 3
    """Keep the newest this many checkpoints (older ones are deleted after each save)."""
    async_save: bool = False
    """Save in the background while training continues; training waits only for a copy to host
    memory (TOML key: async)."""


@dataclass
class DebugConfig:
    """Catching communication bugs."""

    check_collectives: bool = False
    """Fingerprint every collective and fail with a table when ranks disagree."""
    hang_timeout_s: float = 300.0
    """Report which ranks are stuck where after this long without progress (at least 1 s); 0 disables."""
    memory_snapshot: bool = False
    """CUDA only: record every allocation (torch.cuda.memory._record_memory_history) and write
    <out>/memory_snapshot_rank<N>.pickle at the end, for https://pytorch.org/memory_viz; ignored
    with a warning on CPU."""
    profile_steps: str = ""
    """Record a torch.profiler trace of these optimizer steps, `A-B` or `A` (e.g. `3-4`), into
    <out>/profile/rank<N>.trace.json (Chrome/Perfetto JSON; https://ui.perfetto.dev); `shoal report`
    summarizes it. Empty: no profiling."""
    profile_ranks: str = "0"
    """Which ranks record a trace: `all`, or rank numbers separated by commas (`0,3`). Default rank 0:
    one trace is what one usually reads, and every traced rank slows its steps."""
    profile_memory: bool = False
    """Also record tensor allocations in the trace (torch.profiler's profile_memory)."""
    profile_stacks: bool = False
    """Also record each op's Python stack (with_stack; larger traces, slower steps)."""
    overflow_steps: str = ""
    """train.precision=fp16: make these optimizer steps' gradients overflow (`A-B` or `A`), to see the loss
    scaler skip them and go on. Empty: none."""


@dataclass
class MetricsConfig:
    """Where each step's metrics go besides <out>/metrics.jsonl (always written; the source of truth).
    Written by rank 0; per-rank numbers (memory) as one series per rank. A resumed run continues
    the same TensorBoard folder and the same W&B run."""

    tensorboard: bool = False
    """Write TensorBoard event files to <out>/tensorboard (`tensorboard --logdir <out>`); needs
    `pip install 'shoal[tensorboard]'`."""
    wandb: str = ""
    """Weights & Biases: `offline` (files under <out>/wandb, no account or network; `wandb sync` uploads
    them later), `online`, or empty for none; the run id is kept in <out>/wandb/shoal_run_id so a
    resumed run continues it. Needs `pip install 'shoal[wandb]'`."""
    wandb_project: str = "shoal"
    """The W&B project the run belongs to."""


MIN_HANG_TIMEOUT_S = 1.0
"""The shortest hang timeout: the watchdog looks every 0.2 s at best and ordinary work (starting up,
a first step) holds progress longer, so below a second a healthy job is reported hung (exit 124)."""
MAX_HANG_TIMEOUT_S = 7 * 24 * 3600.0
"""The longest: a week without progress is no watchdog at all (0 says so), and far larger values
overflowed the store's timeout in every worker (1e300: OverflowError, a traceback per rank)."""


def hang_timeout_problem(seconds: object) -> str | None:
    """Why `seconds` cannot be a hang timeout, or None: the one rule for debug.hang_timeout_s,
    SHOAL_HANG_TIMEOUT_S (shoal/debug) and `shoal run --hang-timeout`."""
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if number and (seconds == 0 or MIN_HANG_TIMEOUT_S <= seconds <= MAX_HANG_TIMEOUT_S):
        return None
    return (f"must be 0 (no watchdog) or a number of seconds from {MIN_HANG_TIMEOUT_S:g} to {MAX_HANG_TIMEOUT_S:g} "
            "(a week), e.g. 300")


SECTIONS = {
    "model": ModelSection,
    "parallel": ParallelConfig,
    "train": TrainConfig,
    "data": DataConfig,
    "checkpoint": CheckpointConfig,
    "debug": DebugConfig,
    "metrics": MetricsConfig,
}
ALIASES = {("checkpoint", "async"): "async_save"}


@dataclass
class JobConfig:
    model: Any = field(default_factory=ModelSection)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def model_config(self) -> ModelConfig:
        overrides = {f.name: getattr(self.model, f.name) for f in _MODEL_OVERRIDES if getattr(self.model, f.name) is not None}
        if self.model.init_from:
            return model_of(open_pretrained(self.model.init_from), overrides)
        base = get_preset(self.model.preset)
        return base.replace(**overrides).validate(base=base)

    def to_dict(self) -> dict:
        return {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}

    def validate(self) -> "JobConfig":
        """Every check a user can fail that needs no process group: each number finite and in range."""
        m = self.model_config()
        t = self.train
        _check(t.steps > 0, "train.steps", t.steps, "must be a positive integer")
        _check(0 <= t.seed <= MAX_SEED, "train.seed", t.seed, f"must be an integer from 0 to {MAX_SEED} (2**32-1)")
        _check(_finite(t.lr) and t.lr >= 0, "train.lr", t.lr, "learning rate must be a finite number >= 0, e.g. 3e-4")
        _check(_finite(t.min_lr_ratio) and 0 <= t.min_lr_ratio <= 1, "train.min_lr_ratio", t.min_lr_ratio,
               "must be between 0 and 1, e.g. 0.1")
        _check(t.optimizer in ("adamw", "sgd"), "train.optimizer", t.optimizer, "use 'adamw' or 'sgd'")
        _check(t.warmup_steps >= 0, "train.warmup_steps", t.warmup_steps, "must be >= 0")
        _check(_finite(t.weight_decay) and t.weight_decay >= 0, "train.weight_decay", t.weight_decay,
               "must be a finite number >= 0, e.g. 0.1 (0 disables)")
        for name in ("beta1", "beta2"):  # AdamW needs decays in [0, 1): at 1 the moment never moves
            value = getattr(t, name)
            _check(_finite(value) and 0 <= value < 1, f"train.{name}", value, "must be in [0, 1), e.g. 0.9 or 0.95")
        # torch hands the optimizer's step size to its kernel as a float32 scalar and refuses one past
        # float32's range with a traceback: lr for SGD, lr / (1 - beta1) for AdamW's first step (its
        # bias correction). Smaller but huge rates are allowed: they overflow the weights, which the
        # NaN guard stops (train.on_nonfinite).
        first_step = t.lr / (1 - t.beta1) if t.optimizer == "adamw" else t.lr
        _check(first_step <= FLOAT32_MAX, "train.lr", t.lr,
               f"the first update's step size ({'lr / (1 - beta1) = ' if t.optimizer == 'adamw' else ''}"
               f"{first_step:.3g}) exceeds float32's largest number {FLOAT32_MAX:.3g}; use a learning rate "
               "such as 3e-4")
        _check(_finite(t.grad_clip) and t.grad_clip >= 0, "train.grad_clip", t.grad_clip,
               "must be a finite number >= 0 (0 disables clipping)")
        _check(t.micro_batch >= 0, "train.micro_batch", t.micro_batch, "must be >= 0 (0: global_batch / dp)")
        _check(t.global_batch > 0, "train.global_batch", t.global_batch, "must be a positive integer")
        _check(t.seq_len > 1, "train.seq_len", t.seq_len, "must be at least 2")
        _check(t.seq_len <= m.max_seq_len, "train.seq_len", t.seq_len,
               f"exceeds the model's max_seq_len={m.max_seq_len}; lower it or set model.max_seq_len")
        _check_precision(t, m, self.parallel, self.debug)
        _check(t.on_nonfinite in ("stop", "skip"), "train.on_nonfinite", t.on_nonfinite, "use 'stop' or 'skip'")
        _check(t.activation_checkpoint in ACTIVATION_CHECKPOINT, "train.activation_checkpoint",
               t.activation_checkpoint, f"use one of {', '.join(ACTIVATION_CHECKPOINT)}")
        # The zero-bubble schedule computes each block's input and weight gradients in two passes
        # over its autograd graph; a compiled block is one node whose backward does both at once
        # (shoal verify: gradient norm off by 1.4e-2 on pp=2).
        _check(not (t.compile and self.parallel.pp > 1 and self.parallel.pp_schedule == "zero-bubble"), "train.compile",
               t.compile, "cannot split a compiled block's backward as pp_schedule=zero-bubble does; use "
               "parallel.pp_schedule=interleaved-1f1b or train.compile=false")
        _check(not (t.compile and self.parallel.cp > 1), "train.compile", t.compile, "is not supported with parallel."
               "cp > 1 yet (its attention is not traced or verified compiled); set train.compile=false or cp=1")
        _check(t.eval_every >= 0, "train.eval_every", t.eval_every, "must be >= 0")
        _check(t.eval_batches > 0, "train.eval_batches", t.eval_batches, "must be a positive integer")
        _check(0 <= t.sample_tokens <= m.max_new_tokens, "train.sample_tokens", t.sample_tokens,
               f"must be from 0 (no sample) to the model's max_seq_len={m.max_new_tokens}")
        _check(t.sample_prompt != "" or t.sample_tokens == 0, "train.sample_prompt", t.sample_prompt,
               'the sample continues a text; give one (e.g. "def ") or set train.sample_tokens=0')
        p = self.parallel  # the layout's own rules (degrees, divisibility) live with the layout; these are signs
        for name in ("pp_microbatches", "pp_lighter_edges"):
            _check(getattr(p, name) >= 0, f"parallel.{name}", getattr(p, name), "must be >= 0 (see `shoal config`)")
        _check_data(self.data)
        p = self.parallel
        for problem in slow_link_setting_problems(p.topk_density, p.powersgd_rank, p.diloco_inner_steps,
                                                  p.diloco_overlap_steps):
            raise problem
        _check(p.topk_warmup >= 0, "parallel.topk_warmup", p.topk_warmup, "must be >= 0 (0: compress from step 1)")
        _check(p.powersgd_warmup >= 0, "parallel.powersgd_warmup", p.powersgd_warmup, "must be >= 0 (0: compress from step 1)")
        _check(_finite(p.diloco_outer_lr) and p.diloco_outer_lr > 0, "parallel.diloco_outer_lr", p.diloco_outer_lr,
               "must be a finite number > 0, e.g. 0.7")
        _check(_finite(p.diloco_outer_momentum) and 0 <= p.diloco_outer_momentum < 1, "parallel.diloco_outer_momentum",
               p.diloco_outer_momentum, "must be in [0, 1), e.g. 0.9")
        _check(1 <= p.diloco_fragments <= max(1, p.diloco_inner_steps), "parallel.diloco_fragments", p.diloco_fragments,
               f"must be from 1 to diloco_inner_steps={p.diloco_inner_steps} (one fragment synced per step at most)")
        _check(p.diloco_quantize in DILOCO_QUANTIZE, "parallel.diloco_quantize", p.diloco_quantize,
               f"use one of {', '.join(DILOCO_QUANTIZE)}")
        c = self.checkpoint
        _check(c.every >= 0, "checkpoint.every", c.every, "must be >= 0 (0: only at the end)")
        _check(c.keep >= 1, "checkpoint.keep", c.keep, "must be >= 1")
        _check(Path(c.dir).is_absolute() or ".." not in Path(c.dir).parts, "checkpoint.dir", c.dir,
               "a relative checkpoint root lies inside the output directory and may not leave it with '..'; "
               "give an absolute path to put checkpoints elsewhere")
        if c.dir and not Path(c.dir).expanduser().is_absolute():  # an absolute one: check_resume, which knows --out
            _check(not (problem := checkpoint_dir_problem(Path(c.dir))), "checkpoint.dir", c.dir, problem or "")
        h = self.debug.hang_timeout_s
        _check(hang_timeout_problem(h) is None, "debug.hang_timeout_s", h, hang_timeout_problem(h) or "")
        _check_observability(self.debug, self.metrics, t.steps)
        return self


def _check_data(d: DataConfig) -> None:
    for name in ("path", "tokenizer", "text_field"):
        _check(getattr(d, name).strip() != "", f"data.{name}", getattr(d, name), "may not be empty (see `shoal config`)")
    _check(_finite(d.val_fraction) and 0 < d.val_fraction < 1, "data.val_fraction", d.val_fraction,
           "must be in (0, 1), e.g. 0.01: every run ends on an evaluation of the held-out share")
    seen: dict[str, str] = {}  # each corpus once: web.jsonl and ./web.jsonl were trained as two corpora
    for path, weight in d.mix.items():
        _check(path.strip() != "", "data.mix", d.mix, "a data path may not be empty")
        same = seen.setdefault(os.path.normpath(os.path.expanduser(path.strip())), path)
        _check(same == path, f"data.mix.{path}", weight, f"names the same data as data.mix.{same}; give each "
                                                         "corpus once, with the sum of the weights")
        _check(_finite(weight) and weight > 0, f"data.mix.{path}", weight,
               "a weight must be a number > 0 (weights are relative: 0.7 and 0.3, or 7 and 3); leave out a "
               "corpus rather than weighting it 0")
    if d.mix:  # each share is weight / total: a total past a float's range, or weights too far apart, gives 0
        total, (path, least) = sum(d.mix.values()), min(d.mix.items(), key=lambda kv: kv[1])
        _check(least / total > 0, f"data.mix.{path}", least, f"leaves this corpus no share of the weights' total "
               f"({total:g}); weights are relative: give numbers like 0.7 and 0.3")
    _check(not (d.mix and d.path != DataConfig.path), "data.mix", d.mix,
           f"data.path={d.path!r} is set too; train on one or the other (put it in the mix)")


def _check_precision(t: TrainConfig, m: ModelConfig, p: ParallelConfig, debug: DebugConfig) -> None:
    """train.precision and the settings that go with it (fp16's loss scale, fp8's recipe and library).
    Whether this machine's GPU multiplies in FP8 is checked when the job starts (launch/session.py)."""
    _check(t.precision in PRECISIONS, "train.precision", t.precision, f"use one of {', '.join(PRECISIONS)}")
    _check(t.fp8_recipe in FP8_RECIPES, "train.fp8_recipe", t.fp8_recipe, f"use one of {', '.join(FP8_RECIPES)}")
    _check(_finite(t.loss_scale) and 1 <= t.loss_scale <= 2.0**100, "train.loss_scale", t.loss_scale,
           "must be a finite number from 1 to 2**100, e.g. 65536")
    _check(t.loss_scale_window >= 1, "train.loss_scale_window", t.loss_scale_window, "must be >= 1, e.g. 2000")
    _check(profile_steps_problem(debug.overflow_steps) is None, "debug.overflow_steps", debug.overflow_steps,
           profile_steps_problem(debug.overflow_steps) or "")
    _check(not debug.overflow_steps.strip() or t.precision == "fp16", "debug.overflow_steps", debug.overflow_steps,
           f"forces fp16 overflows, but train.precision={t.precision}; set train.precision=fp16 or leave it empty")
    if t.precision != "fp8":
        return
    import importlib.util

    _check(importlib.util.find_spec("torchao") is not None, "train.precision", "fp8",
           "needs torchao's float8 training: pip install 'shoal[fp8]' (or use bf16)")
    # torch._scaled_mm (and torchao's emulation of it) multiplies matrices whose sides are multiples of 16.
    sides = {"model.dim": m.dim, "model.ffn_hidden": m.ffn_hidden, "n_kv_heads*head_size": m.n_kv_heads * m.head_size}
    if m.is_moe:
        sides["model.expert_ffn_hidden"] = m.expert_hidden
    for name, value in sides.items():
        _check(value % 16 == 0, "train.precision", "fp8", f"FP8 matrix products need sides that are multiples of 16, "
               f"but {name}={value}; change it or use bf16")


def _check_observability(debug: DebugConfig, metrics: MetricsConfig, steps: int) -> None:
    """debug.profile_* and [metrics]: well formed, within the run, and their libraries installed."""
    _check(profile_steps_problem(debug.profile_steps) is None, "debug.profile_steps", debug.profile_steps,
           profile_steps_problem(debug.profile_steps) or "")
    if (asked := profile_step_range(debug.profile_steps)) is not None:
        _check(asked[1] <= steps, "debug.profile_steps", debug.profile_steps,
               f"ends after the run's last step (train.steps={steps}); profile steps within it, e.g. 3-4")
    _check(debug.profile_ranks.strip() == "all" or profile_ranks(debug.profile_ranks) is not None,
           "debug.profile_ranks", debug.profile_ranks, "use `all` or rank numbers separated by commas, e.g. 0 or 0,3")
    _check(metrics.wandb in ("", "offline", "online"), "metrics.wandb", metrics.wandb,
           "use `offline` (no account or network needed), `online`, or leave it empty for none")
    _check(metrics.wandb_project.strip() != "", "metrics.wandb_project", metrics.wandb_project, "may not be empty, e.g. shoal")
    for problem in metrics_backend_problems(metrics):
        raise problem


FLOAT32_MAX = 3.4028234663852886e38
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds both take it; model init multiplies the seed, so no more


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check(ok: bool, name: str, value: object, fix: str) -> None:
    if not ok:
        raise UserError(name, value, fix)


def _field_kinds(section: str) -> dict[str, type]:
    """Each field's Python type, read off its default (ModelConfig's defaults for [model] overrides)."""
    if section == "model":
        defaults = {f.name: f.default for f in _MODEL_OVERRIDES} | {"preset": "tiny", "init_from": ""}
    else:
        defaults = {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
                    for f in fields(SECTIONS[section])}
    return {name: type(value) for name, value in defaults.items()}


def _set(cfg: JobConfig, dotted: str, raw: Any) -> str:
    """Sets one field from a TOML value or a --set string; returns its name (section.key, aliases resolved)."""
    section, _, key = dotted.partition(".")
    if section not in SECTIONS or not key:
        close = difflib.get_close_matches(section, SECTIONS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(dotted, raw, f"unknown section; {hint}sections: {', '.join(SECTIONS)} (write section.key=value)")
    written = f"{section}.{key}"  # messages name the key as the user wrote it (checkpoint.async)
    key = ALIASES.get((section, key), key)
    kinds = _field_kinds(section)
    if key not in kinds:
        close = difflib.get_close_matches(key, kinds, n=1)
        hint = f"did you mean {section}.{close[0]}? " if close else ""
        raise UserError(dotted, raw, f"unknown key; {hint}see `shoal config` for every field")
    setattr(getattr(cfg, section), key, coerce(written, raw, kinds[key]))
    return f"{section}.{key}"


def load_config(recipe: str | Path | None = None, overrides: list[str] = ()) -> JobConfig:
    """Defaults, then the TOML recipe, then each `section.key=value` override, then validation."""
    cfg = JobConfig()
    layer = {}  # section.key -> where it was last written: 1 the recipe, 2.. each --set in turn (0: default)
    if recipe is not None:
        data = _read_recipe(Path(recipe))
        for section, values in data.items():
            if not isinstance(values, dict):
                raise UserError(section, values, "top-level keys must be [section] tables")
            for (sec, alias), name in ALIASES.items():  # one field under two keys: which would win is a guess
                if sec == section and alias in values and name in values:
                    raise UserError(f"{section}.{alias}", values[alias], f"{section}.{name} is set too and is the "
                                                                         "same field; keep one of the two keys")
            for key, value in values.items():
                layer[_set(cfg, f"{section}.{key}", value)] = 1
    for i, item in enumerate(overrides):
        dotted, eq, value = item.partition("=")
        if not eq or "." not in dotted:
            raise UserError("--set", item, "write --set section.key=value, e.g. --set train.steps=50")
        layer[_set(cfg, dotted.strip(), value)] = 2 + i
    _follow_the_tokenizer(cfg, layer)
    cfg.validate()
    # A warmup longer than the run never reaches the peak lr. Refused where the warmup was written
    # with the steps or after them; a train.steps written later (a recipe cut short for a smoke
    # test, --set train.steps=5) keeps the warmup it was not written for, as the default does.
    t = cfg.train
    if t.warmup_steps > t.steps and layer.get("train.warmup_steps", 0) >= layer.get("train.steps", 0):
        raise UserError("train.warmup_steps", t.warmup_steps, f"is longer than the run (train.steps={t.steps}), so "
                        f"the learning rate never reaches train.lr; use at most {t.steps}, or raise train.steps")
    return cfg


VOCAB_MULTIPLE = 128
"""A vocabulary sized from a tokenizer is rounded up to this (as Megatron's make-vocab-size-divisible-by):
tensor parallelism splits it evenly, and the head's matmul keeps aligned shapes."""


def _follow_the_tokenizer(cfg: JobConfig, layer: dict) -> None:
    """model.init_from is the model, and brings its tokenizer (pretrained.take_the_folder); without
    it, a prepared data.path brings its tokenizer (corpus.take_the_prepared) and model.vocab_size follows the tokenizer (rounded up to VOCAB_MULTIPLE) unless given. (Written
    into the config, so job.json and run.json hold what the run used.)

    init_from replaces what an earlier source set (a recipe's preset, shape and tokenizer, under
    `--set model.init_from=...`); what is set beside it or after it, the folder's rules judge."""
    def source(key: str) -> int:  # 0 the defaults, 1 the recipe, 2 the command line
        return min(layer.get(key, 0), 2)

    if not cfg.model.init_from:
        from shoal.data.corpus import take_the_prepared

        take_the_prepared(cfg, given=layer.keys())
    if cfg.model.init_from:
        mine = source("model.init_from")
        for key in [k for k in layer if k.startswith(("model.", "data.tokenizer")) and source(k) < mine]:
            section, name = key.split(".")
            setattr(getattr(cfg, section), name, getattr(type(getattr(cfg, section))(), name))
            del layer[key]
        take_the_folder(cfg, given=layer.keys())
    elif cfg.data.tokenizer != "byte" and "model.vocab_size" not in layer:
        from shoal.data.tokenizer import load_tokenizer
        from shoal.model.config import SIZE_LIMITS

        ids = load_tokenizer(cfg.data.tokenizer).vocab_size
        if ids > SIZE_LIMITS["vocab_size"]:  # said of the tokenizer: model.vocab_size was never written
            raise UserError("data.tokenizer", cfg.data.tokenizer, f"its largest token id is {ids - 1:,}, past the "
                            f"{SIZE_LIMITS['vocab_size']:,} rows a model's embedding may have; renumber its "
                            "vocabulary from 0")
        cfg.model.vocab_size = -(-ids // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def config_from_sections(sections: dict, overrides: list[str] = ()) -> JobConfig:
    """A JobConfig from stored sections (JobConfig.to_dict(): job.json, run.json, a checkpoint's
    train_state.json), then --set overrides, validated."""
    cfg = JobConfig()
    for section, values in sections.items():
        for key, value in values.items():
            if value is not None:
                _set(cfg, f"{section}.{key}", value)
    for item in overrides:
        dotted, _, value = item.partition("=")
        _set(cfg, dotted.strip(), value)
    return cfg.validate()


def _read_recipe(path: Path) -> dict:
    """The recipe's tables; every way a file can be unusable is one UserError naming it."""
    give = "a .toml file (see recipes/ for examples)"
    if (folder := model_folder_of(path)) is not None:  # a model where the recipe belongs
        give += f"; to start from this model, --set model.init_from={folder}"
    return read_toml("recipe", path, give, parse_float=toml_float)


def _docstrings(cls) -> dict[str, str]:
    """Field docstrings (the string literal right after each field), read from the class source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    docs, body = {}, tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def config_reference(cfg: JobConfig) -> list[tuple[str, Any, str]]:
    """(section.key, value, meaning) for every field, in declaration order."""
    rows = []
    for section, cls in SECTIONS.items():
        if section == "model":
            docs = {"preset": "A named model (see `shoal presets`).", "init_from": INIT_FROM_DOC} | _docstrings(ModelConfig)
            names = ["preset", "init_from"] + [f.name for f in _MODEL_OVERRIDES]
        else:
            docs, names = _docstrings(cls), [f.name for f in fields(cls)]
        for name in names:
            key = next((alias for (sec, alias), real in ALIASES.items() if sec == section and real == name), name)
            value = getattr(getattr(cfg, section), name)
            doc = docs.get(name, "")
            if section == "model" and name not in ("preset", "init_from"):
                value = getattr(cfg.model_config(), name) if value is None else value
                doc = f"(overrides the preset) {doc}".strip()
            rows.append((f"{section}.{key}", value, doc))
    return rows
