"""What is being planned: the workload (model + batch), the cluster, and one parallel layout.

The layout's vocabulary is the trainer's (DESIGN.md): dp, tp, pp, ep, zero, micro_batch,
pp_schedule, pp_virtual, recompute, sequence_parallel. world = dp * tp * pp; ep borrows ranks from
the data-parallel dimension (it divides dp), as in torchtitan.

The rank grid is laid out with tp innermost, then dp, then pp outermost (torchtitan's
[pp, dp, tp] order), so a TP group is tp consecutive ranks (inside one node when tp <= gpus per
node), a DP or EP group strides over tp, and a PP group strides over tp * dp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from shoal.model.config import ModelConfig
from shoal.planner.hardware import GPU

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe")
PRECISIONS = ("bf16", "fp32")
ATTENTION = ("flash", "unfused")


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    """The model (a preset or a shape), from shoal.model.config."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    precision: str = "bf16"
    """`bf16` mixed precision (fp32 master weights and Adam state) or plain `fp32`."""
    attention: str = "flash"
    """`flash`: fused attention that keeps no S×S matrix (what shoal runs). `unfused`: the S×S scores,
    softmax and dropout are materialised, as in Megatron-LM before flash attention (Korthikanti's
    Table 2 layer); use it to compare with runs from 2021-2022."""

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch


@dataclass(frozen=True)
class Cluster:
    gpu: GPU
    """The device and its links (hardware.py)."""
    n_gpus: int
    """Ranks in the job: dp * tp * pp."""
    gpus_per_node: int
    """Usually gpu.gpus_per_node; `--gpus-per-node` changes it."""

    @property
    def n_nodes(self) -> int:
        return math.ceil(self.n_gpus / self.gpus_per_node)


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    """Data-parallel degree (the trainer's dp_shard when zero >= 1, dp_replicate when zero = 0)."""
    tp: int = 1
    """Tensor-parallel degree (innermost: neighbouring ranks)."""
    pp: int = 1
    """Pipeline stages (outermost)."""
    ep: int = 1
    """Expert-parallel degree; divides dp (ranks borrowed from data parallelism)."""
    zero: int = 1
    """0: DDP; 1: optimizer state sharded; 2: + gradients; 3: + parameters (FSDP)."""
    micro_batch: int = 1
    """Sequences per forward/backward on one rank."""
    pp_schedule: str = "1f1b"
    pp_virtual: int = 1
    """Pipeline chunks per rank (interleaved-1f1b only)."""
    recompute: str = "none"
    """Activation recomputation: none, selective (attention core) or full (whole layer)."""
    sequence_parallel: bool = False
    """Split norms and dropout along the sequence over the TP group (Korthikanti et al.)."""

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def microbatches(self, global_batch: int) -> int:
        """Micro-batches per step on one pipeline (gradient accumulation steps when pp == 1)."""
        return global_batch // (self.dp * self.micro_batch)

    def short(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        parts.append(f"z{self.zero}")
        parts.append(f"mb{self.micro_batch}")
        if self.pp > 1:
            parts.append({"1f1b": "1f1b", "gpipe": "gpipe"}.get(self.pp_schedule, f"int{self.pp_virtual}"))
        parts.append({"none": "noAC", "selective": "selAC", "full": "fullAC"}[self.recompute])
        if self.tp > 1 and self.sequence_parallel:
            parts.append("sp")
        return " ".join(parts)


@lru_cache(maxsize=256)
def moe_layer_count(cfg: ModelConfig) -> int:
    """cfg.n_moe_layers, cached: it walks every layer and the search asks thousands of times."""
    return cfg.n_moe_layers


def group_ranks_per_node(size: int, stride: int, gpus_per_node: int) -> int:
    """How many members of a process group share a node, for a group of `size` ranks `stride` apart."""
    if size <= 1:
        return 1
    if stride >= gpus_per_node:
        return 1
    return max(1, min(size, gpus_per_node // stride))


def layers_per_rank(n_layers: int, pp: int, virtual: int) -> int:
    """Layers on the busiest pipeline rank: stages take ceil(L / (pp * v)) layers each."""
    return math.ceil(n_layers / (pp * virtual)) * virtual


def invalid_reason(workload: Workload, layout: Layout, n_gpus: int) -> tuple[str, object, str] | None:
    """Why a layout cannot run at all (field, value, fix), or None. Memory is checked elsewhere."""
    cfg = workload.model
    lay = layout
    if lay.world != n_gpus:
        return ("gpus", n_gpus, f"dp*tp*pp = {lay.dp}*{lay.tp}*{lay.pp} = {lay.world} must equal the GPU count")
    if cfg.n_heads % lay.tp:
        return ("tp", lay.tp, f"must divide n_heads={cfg.n_heads}; try {_divisors(cfg.n_heads, upto=64)}")
    if cfg.n_kv_heads % lay.tp:
        return ("tp", lay.tp, f"must divide n_kv_heads={cfg.n_kv_heads}; try {_divisors(cfg.n_kv_heads, upto=64)}")
    if cfg.ffn_hidden % lay.tp or (cfg.is_moe and cfg.expert_hidden % lay.tp):
        return ("tp", lay.tp, f"must divide the MLP hidden size {cfg.ffn_hidden}")
    if lay.pp > cfg.n_layers:
        return ("pp", lay.pp, f"more stages than n_layers={cfg.n_layers}; use at most {cfg.n_layers}")
    if lay.pp_schedule not in SCHEDULES:
        return ("pp_schedule", lay.pp_schedule, f"use one of {', '.join(SCHEDULES)}")
    if lay.pp_schedule == "interleaved-1f1b":
        if lay.pp == 1:
            return ("pp_schedule", lay.pp_schedule, "interleaving needs pp > 1; use 1f1b or raise --pp")
        if lay.pp_virtual < 2:
            return ("pp_virtual", lay.pp_virtual, "interleaved-1f1b needs at least 2 chunks per rank")
        if lay.pp * lay.pp_virtual > cfg.n_layers:
            return ("pp_virtual", lay.pp_virtual,
                    f"pp*v = {lay.pp * lay.pp_virtual} chunks > n_layers={cfg.n_layers}; use v <= {cfg.n_layers // lay.pp}")
    elif lay.pp_virtual != 1:
        return ("pp_virtual", lay.pp_virtual, "only interleaved-1f1b has virtual stages; use --pp-schedule interleaved-1f1b")
    if lay.ep < 1 or lay.dp % lay.ep:
        return ("ep", lay.ep, f"must divide dp={lay.dp} (expert parallelism borrows data-parallel ranks)")
    if lay.ep > 1 and not cfg.is_moe:
        return ("ep", lay.ep, "the model has no experts; use ep=1")
    if cfg.is_moe and cfg.n_experts % lay.ep:
        return ("ep", lay.ep, f"must divide n_experts={cfg.n_experts}; try {_divisors(cfg.n_experts, upto=lay.dp)}")
    if lay.zero not in (0, 1, 2, 3):
        return ("zero", lay.zero, "use 0, 1, 2 or 3")
    if lay.recompute not in RECOMPUTE:
        return ("recompute", lay.recompute, f"use one of {', '.join(RECOMPUTE)}")
    if lay.micro_batch < 1:
        return ("micro_batch", lay.micro_batch, "must be >= 1")
    if workload.global_batch % (lay.dp * lay.micro_batch):
        per_rank = workload.global_batch / lay.dp
        return ("global_batch", workload.global_batch,
                f"must be divisible by dp*micro_batch = {lay.dp}*{lay.micro_batch}"
                + (f"; {per_rank:g} sequences per data-parallel rank" if per_rank >= 1 else
                   f"; dp={lay.dp} is larger than the batch, raise tp or pp"))
    m = lay.microbatches(workload.global_batch)
    if lay.pp_schedule == "interleaved-1f1b" and m % lay.pp:
        return ("pp_microbatches", m, f"interleaved-1f1b needs a multiple of pp={lay.pp} micro-batches; "
                                      f"change --micro-batch or --global-batch")
    if lay.sequence_parallel and lay.tp == 1:
        return ("sequence_parallel", True, "needs tp > 1")
    if workload.seq_len % lay.tp and lay.sequence_parallel:
        return ("seq_len", workload.seq_len, f"must be divisible by tp={lay.tp} for sequence parallelism")
    return None


def trainer_limit(workload: Workload, layout: Layout) -> tuple[str, object, str] | None:
    """Why `shoal train` cannot run this (valid) layout yet, or None.

    The search keeps to what the trainer runs, so an emitted recipe runs unchanged; a layout pinned
    on the command line is still evaluated, with this as a warning. Mirrors parallel/mesh.py.
    """
    cfg, lay = workload.model, layout
    if cfg.vocab_size % lay.tp:
        return ("tp", lay.tp, f"the vocab-parallel head needs tp to divide vocab_size={cfg.vocab_size}")
    if cfg.is_moe and lay.tp > 1:
        return ("tp", lay.tp, "shoal train has no tensor parallelism for MoE layers yet; use ep")
    if lay.ep > 1 and lay.zero == 1:
        return ("zero", 1, "shoal train's ZeRO-1 does not run with expert parallelism; use zero 0, 2 or 3")
    if lay.pp > 1 and cfg.tie_embeddings:
        return ("pp", lay.pp, "shoal train cannot tie embeddings across pipeline stages; use pp 1")
    return None


def _divisors(n: int, upto: int) -> list[int]:
    return [d for d in range(1, min(n, upto) + 1) if n % d == 0]
