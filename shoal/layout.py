"""The parallel layout: one vocabulary and one list of rules, for the trainer and the planner alike.

A layout says how a job's ranks split the work: data parallelism (dp_replicate x dp_shard, with a
ZeRO stage on the sharded part), tensor (+ sequence) parallelism, pipeline stages with a schedule,
and expert parallelism borrowing data-parallel ranks. The names are the trainer's config fields
(`parallel.*`, plus `train.micro_batch` and `train.activation_checkpoint`), so a plan is a recipe.

The rules for whether shoal train runs a layout live beside it, in layout_rules.py (`problems()`). Torch-free:
the planner imports both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from shoal.errors import UserError

MAX_GPUS = 10_000_000
"""The most ranks a job or a plan may have: a hundred times the largest clusters built (~100k GPUs,
2024-25). Past it a count is a typo, and the planner's divisor loops would take minutes."""

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble", "dualpipe")
INTERLEAVED = ("interleaved-1f1b", "zero-bubble")
PLAN_ONLY_SCHEDULES = ("dualpipe",)
"""Schedules shoal plan plans for other trainers and shoal train refuses. dualpipe: DeepSeek-V3's bidirectional
pipeline (arXiv:2412.19437 §3.2.1, deepseek-ai/DualPipe): pipeline rank i holds stages i and pp-1-i, micro-batches
enter from both ends, and a forward and a backward chunk of opposite directions run as one overlapped pair."""
ACTIVATION_CHECKPOINT = ("none", "selective", "selective-op", "full")
"""none: keep every activation. selective: keep the outputs of matmuls and of the attention kernel,
recompute the element-wise work between them (norms, activation functions, rotary) in backward.
selective-op: torchtitan's per-op selective checkpointing (`selective_ac_option = "op"`): like
selective, but the output of every second matmul of a block (wk, wo and w3 of a Llama block) is
recomputed too. full: keep only each block's input and recompute the whole block."""
ZERO_STAGES = (0, 1, 2, 3)
GRAD_COMPRESSION = ("none", "bf16", "int8", "topk", "powersgd")
"""How gradients cross the data-parallel group (shoal/parallel/compression.py). bf16 is a reduce
dtype and runs on every data-parallel wrapper; the others replace the reduction itself: a DDP comm
hook, or FSDP2's reduce-scatter and HSDP all-reduce hooks (compression_fsdp.py)."""
DILOCO_QUANTIZE = ("none", "bf16", "int8", "fp4")
"""How DiLoCo's pseudo-gradient crosses the replica groups: fp32, bf16, int8 with an fp32 scale per
256 values, or 4 bits (a sign and a power of two) with the same scales (parallel/compression.py)."""
RANK_ORDER_DIMS = ("tp", "dp", "pp")
"""The dimensions parallel.rank_order orders, innermost (neighbouring ranks) first. dp stands for
dp_shard inside dp_replicate, with ep inside dp_shard, so they stay together. cp may be named too;
an order that leaves it out has it just outside tp (rank_dims), so recipes written before context
parallelism keep their meaning."""
OFFLOAD = ("none", "optimizer", "params")
"""parallel.offload: what lives in host memory between uses. optimizer: fp32 master weights and Adam
moments, the update on the CPU (ZeRO-Offload; planned, not built in shoal train yet); params: the
parameters, gradients and the optimizer step too (FSDP2's CPUOffloadPolicy, parallel/data_parallel.py)."""
DEFAULT_RANK_ORDER = "tp-dp-pp"
"""TP on neighbouring ranks (inside a node), then CP, PP outermost: Megatron's and torchtitan's order."""


@lru_cache(maxsize=64)  # the planner asks for every layout it weighs; a job has one or two orders
def rank_dims(rank_order: str) -> tuple[str, ...]:
    """rank_order's dimensions innermost first, with cp just outside tp when the order does not name it."""
    dims = rank_order.split("-")
    if "cp" not in dims and "tp" in dims:
        dims.insert(dims.index("tp") + 1, "cp")
    return tuple(dims)


def compresses_in_hooks(method: str) -> bool:
    """int8, topk and powersgd run shoal's own reduction (parallel/compression.py) in the wrapper's hooks."""
    return method in ("int8", "topk", "powersgd")


class TrainerLimit(UserError):
    """A layout that is sound but that shoal train cannot run yet (the planner can still evaluate
    it for other trainers, and says so)."""


@dataclass(frozen=True)
class Layout:
    """A resolved layout. Each field means what the config field of the same name means
    (`shoal config` prints them: parallel.*, train.micro_batch, train.activation_checkpoint), with
    nothing left open: dp_shard is a count, micro_batch at least 1."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1
    ep: int = 1
    expert_tp: int = 0
    zero: int = 3
    micro_batch: int = 1
    pp_schedule: str = "1f1b"
    pp_microbatches: int = 0
    pp_virtual_stages: int = 1
    activation_checkpoint: str = "none"
    sequence_parallel: bool = True
    grad_compression: str = "none"
    diloco_inner_steps: int = 0
    rank_order: str = DEFAULT_RANK_ORDER
    offload: str = "none"
    activation_offload: bool = False

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def hsdp_replicas(self) -> int:
        """HSDP's replica groups: dp_replicate under zero 2/3 (FSDP2's 2-D mesh, parallel/parallelize.dp_mesh),
        each holding a whole copy of the state sharded over its dp_shard x cp ranks; 1 otherwise (zero 0/1
        replicate or shard over all of dp, and a dp_shard x cp of 1 has nothing to shard)."""
        return self.dp_replicate if self.zero >= 2 and self.dp_shard * self.cp > 1 else 1

    @property
    def zero_group(self) -> int:
        """Ranks one ZeRO shard spans: dp x cp (context-parallel ranks hold the same weights), within a replica
        group under HSDP."""
        return self.dp * self.cp // self.hsdp_replicas

    @property
    def experts_split(self) -> int:
        """How many ways each routed expert is split: expert_tp, or where it is 0 the layout's own split, tp when
        ep fits inside dp_shard and 1 when the expert group folds over tp/cp ranks (planner/workload.expert_grid)."""
        return self.expert_tp or (self.tp if self.ep <= 1 or self.dp_shard % self.ep == 0 else 1)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def virtual_stages(self) -> int:
        """Stages per pipeline rank: 1 for gpipe/1f1b, at least 2 for the interleaved schedules."""
        return max(2, self.pp_virtual_stages) if self.pp_schedule in INTERLEAVED else 1

    @property
    def replicates_with_ddp(self) -> bool:
        """Data parallelism runs on DDP: replication (zero 0, ZeRO-1's gradient half, or nothing to
        shard across) of a model split no other way. Split models replicate or shard through FSDP2."""
        return replicates_with_ddp(self.dp_shard * self.cp, self.zero, self.tp, self.pp, self.ep)

    @property
    def sequence_parallel_on(self) -> bool:
        return self.sequence_parallel and self.tp > 1

    def rank_stride(self, dim: str) -> int:
        """How many ranks apart neighbours of a tp/cp/dp/pp group are: the product of the dimensions
        inside it in rank_order (with the default order tp is 1, cp is tp, dp is tp*cp, pp is tp*cp*dp)."""
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        inner = rank_dims(self.rank_order)
        return math.prod(sizes[d] for d in inner[:inner.index(dim)])

    def microbatches(self, global_batch: int) -> int:
        """Micro-batches each pipeline (each data-parallel rank) runs per step."""
        per_rank = global_batch // self.dp
        return self.pp_microbatches or per_rank // self.micro_batch

    def short(self) -> str:
        parts = [f"dp{self.dp}" if self.dp_replicate == 1 or self.dp_shard == 1
                 else f"dp{self.dp_replicate}x{self.dp_shard}", f"tp{self.tp}", f"pp{self.pp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.expert_tp:
            parts.append(f"etp{self.expert_tp}")
        parts += [f"z{self.zero}", f"mb{self.micro_batch}"]
        if self.pp > 1:
            parts.append(self.pp_schedule + (f"x{self.virtual_stages}" if self.virtual_stages > 1 else ""))
        parts.append({"none": "noAC", "selective": "selAC", "selective-op": "opAC", "full": "fullAC"}[self.activation_checkpoint])
        if self.sequence_parallel_on:
            parts.append("sp")
        if self.grad_compression != "none":
            parts.append(self.grad_compression)
        if self.diloco_inner_steps:
            parts.append(f"diloco{self.diloco_inner_steps}")
        if self.rank_order != DEFAULT_RANK_ORDER:
            parts.append(f"order {self.rank_order}")
        if self.offload != "none":
            parts.append(f"offload-{self.offload}")
        if self.activation_offload:
            parts.append("act-offload")
        return " ".join(parts)


# Where each layout field lives in the job config (the trainer's TOML).
CONFIG_FIELD = {"micro_batch": "train.micro_batch", "activation_checkpoint": "train.activation_checkpoint",
                "activation_offload": "train.activation_offload"}


def config_name(field: str) -> str:
    return CONFIG_FIELD.get(field, field if "." in field else f"parallel.{field}")


def replicates_with_ddp(dp_shard: int, zero: int, tp: int, pp: int, ep: int) -> bool:
    """See Layout.replicates_with_ddp (parallelize.uses_ddp asks here: one home for the rule)."""
    return (dp_shard == 1 or zero in (0, 1)) and tp == pp == ep == 1
