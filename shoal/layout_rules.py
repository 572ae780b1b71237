"""Whether shoal train runs a layout (layout.py's Layout), and why not: each rule a UserError naming the config
field, its value and a fix, or a TrainerLimit for a layout that is sound but not built yet. The one home of the
layout rules: the job resolver, the planner's search and `shoal plan` all ask here. Torch-free."""

from __future__ import annotations

import math
from dataclasses import replace

from shoal.errors import UserError
from shoal.layout import (ACTIVATION_CHECKPOINT, DEFAULT_RANK_ORDER, GRAD_COMPRESSION, INTERLEAVED, OFFLOAD,
                          PLAN_ONLY_SCHEDULES, RANK_ORDER_DIMS, SCHEDULES, ZERO_STAGES, Layout, TrainerLimit,
                          compresses_in_hooks, config_name, rank_dims)
from shoal.model.config import ModelConfig


def problems(lay: Layout, model: ModelConfig, world: int, global_batch: int, seq_len: int) -> list[UserError]:
    """Everything that stops `lay` from running `model` on `world` ranks with this batch, each a
    UserError naming the config field, its value and a fix. Empty: shoal train runs it."""
    out: list[UserError] = []

    def bad(field: str, value: object, fix: str) -> None:
        out.append(UserError(config_name(field), value, fix))

    def limit(field: str, value: object, fix: str) -> None:
        out.append(TrainerLimit(config_name(field), value, fix))

    for name in ("dp_replicate", "dp_shard", "tp", "cp", "pp", "ep", "micro_batch", "pp_virtual_stages"):
        if getattr(lay, name) < 1:
            bad(name, getattr(lay, name), "must be a positive integer")
    if out:
        return out
    if sorted(rank_dims(lay.rank_order)) != sorted((*RANK_ORDER_DIMS, "cp")):
        bad("rank_order", lay.rank_order, f"name {', '.join(RANK_ORDER_DIMS)} once each (and cp at most once), "
            f"innermost first, joined by '-', e.g. {DEFAULT_RANK_ORDER} (tp inside a node) or dp-tp-pp")
        return out
    m = model
    if lay.world != world:
        bad("dp_shard", lay.dp_shard, f"dp_replicate*dp_shard*tp*pp*cp = {lay.dp_replicate}*{lay.dp_shard}*{lay.tp}*"
            f"{lay.pp}*{lay.cp} = {lay.world}, but the world size is {world}; use dp_shard=-1 or one of: "
            f"{factorizations(world)}")
    if not splits_heads(m, lay.tp):
        bad("tp", lay.tp, f"must divide n_heads={m.n_heads}, and divide n_kv_heads={m.n_kv_heads} or be a multiple "
            f"of it; try {[t for t in divisors_upto(m.n_heads, world) if splits_heads(m, t)]}")
    if m.ffn_hidden % lay.tp or (m.is_moe and m.expert_hidden % lay.tp):
        bad("tp", lay.tp, f"must divide the MLP hidden size (model.ffn_hidden={m.ffn_hidden})")
    if m.vocab_size % lay.tp:  # shoal's vocabulary-parallel embedding and head
        limit("tp", lay.tp, f"must divide model.vocab_size={m.vocab_size}")
    if lay.tp > 1 and m.is_moe:
        limit("tp", lay.tp, "tensor parallelism of MoE layers is not supported yet; use parallel.ep")
    out += model_limits(m)
    if lay.sequence_parallel_on and seq_len % (lay.tp * lay.cp):
        # Sound (GSPMD pads, or shards the hidden dimension instead: PaLM's 12-way model axis on 2048 tokens);
        # shoal's DTensor plan shards whole sequence slices.
        limit("sequence_parallel", True, f"train.seq_len={seq_len} must be divisible by tp*cp={lay.tp * lay.cp}; "
              f"or set parallel.sequence_parallel=false")
    if lay.zero not in ZERO_STAGES:
        bad("zero", lay.zero, "use 0, 1, 2 or 3")
    elif lay.zero == 1 and lay.dp * lay.cp == 1:
        # A no-op, not a contradiction: Megatron's distributed optimizer runs on one data-parallel rank, and
        # published layouts name it so; the planner plans it as zero=0, shoal train asks for the honest setting.
        limit("zero", 1, "ZeRO-1 shards the optimizer over data-parallel ranks but dp=1; use zero=0 "
              "or give data parallelism ranks (parallel.dp_shard)")
    if lay.ep > 1:
        if not m.is_moe:
            bad("ep", lay.ep, "expert parallelism needs an MoE model (model.n_experts > 0); use ep=1")
        elif m.n_experts % lay.ep or (lay.dp_shard * lay.tp * lay.cp) % lay.ep:
            bad("ep", lay.ep, f"must divide dp_shard={lay.dp_shard} (ep borrows data-parallel ranks) and "
                f"n_experts={m.n_experts}; try {divisors_upto(math.gcd(lay.dp_shard, m.n_experts), world)}")
        elif lay.dp_shard % lay.ep:  # sound: Megatron-Core's MoE parallel folding spans tp and cp ranks too
            limit("ep", lay.ep, f"an expert group wider than dp_shard={lay.dp_shard} folds over tp/cp ranks "
                  f"(Megatron-Core's MoE parallel folding), which shoal train does not; use ep in "
                  f"{divisors_upto(math.gcd(lay.dp_shard, m.n_experts), world)}")
        if lay.zero == 1:
            limit("zero", 1, "expert parallelism runs with zero=0, 2 or 3 (expert parameters differ across "
                "the ZeRO-1 group)")
    out += _expert_tp_problems(lay, m)
    if lay.activation_checkpoint not in ACTIVATION_CHECKPOINT:
        bad("activation_checkpoint", lay.activation_checkpoint, f"use one of {', '.join(ACTIVATION_CHECKPOINT)}")
    out += _context_parallel_problems(lay, m, seq_len)
    out += _compression_problems(lay)
    out += _offload_problems(lay)
    out += _diloco_problems(lay)
    out += _pipeline_problems(lay, m)
    out += _batch_problems(lay, global_batch)
    return out


def _expert_tp_problems(lay: Layout, m: ModelConfig) -> list[UserError]:
    """parallel.expert_tp: whole groups of expert_tp x ep ranks out of the tp*cp*dp_shard ranks (Megatron-Core's
    expert grid), each expert's hidden units split evenly; shoal train only splits experts as the layout implies."""
    etp = lay.expert_tp
    if not etp:
        return []
    name = config_name("expert_tp")
    if etp < 0:
        return [UserError(name, etp, "must be 0 (experts split as the layout implies) or a positive integer")]
    if not m.is_moe:
        return [UserError(name, etp, f"expert tensor parallelism needs an MoE model (model.n_experts > 0); leave "
                          f"{name} at 0")]
    ranks = lay.dp_shard * lay.tp * lay.cp
    if ranks % (etp * lay.ep) or m.expert_hidden % etp:
        fits = ([e for e in divisors_upto(ranks // lay.ep, ranks) if m.expert_hidden % e == 0]
                if ranks % lay.ep == 0 else [])
        return [UserError(name, etp, f"expert_tp x ep must divide dp_shard*tp*cp={ranks} and expert_tp the "
                          f"experts' hidden size {m.expert_hidden}; try {fits or 0}")]
    implied = replace(lay, expert_tp=0).experts_split
    if etp != implied:
        return [TrainerLimit(name, etp, f"shoal train splits experts as the layout implies ({implied} ways here); "
                             f"leave {name} at 0")]
    return []


def model_limits(m: ModelConfig) -> list[UserError]:
    """What stops shoal train from running this model in any layout (the planner still plans it): the
    search skips its pass over layouts shoal train runs when there is one."""
    if m.is_mla:  # the planner plans it (model/analytics.py); shoal's transformer computes plain attention only
        return [TrainerLimit("model.kv_lora_rank", m.kv_lora_rank, "shoal train has no multi-head latent attention "
                             "in this build (shoal plan plans it for other trainers); set model.kv_lora_rank, "
                             "q_lora_rank, qk_rope_head_dim and v_head_dim to 0 to train plain attention")]
    if m.is_moe and 0 < m.expert_groups_per_token < m.expert_groups:  # the planner's dispatch reads it (timing.py)
        return [TrainerLimit("model.expert_groups", m.expert_groups, "shoal train routes each token over every "
                             "expert (no group-limited routing in this build; shoal plan plans it for other "
                             "trainers); set model.expert_groups and expert_groups_per_token to 0")]
    return []




def _context_parallel_problems(lay: Layout, m: ModelConfig, seq_len: int) -> list[UserError]:
    """Context parallelism (parallel/context_parallel.py) cuts each sequence into 2*cp chunks and gives
    rank i chunks i and 2*cp-1-i (a front and a back one, so causal attention's work is even); its
    ranks hold the same parameters and reduce gradients with the data-parallel ranks."""
    cp = lay.cp
    if cp == 1:
        return []
    out: list[UserError] = []
    if seq_len % (2 * cp):
        fits = [c for c in divisors_upto(seq_len // 2, seq_len) if c > 1][:6]
        out.append(UserError("parallel.cp", cp, f"splits train.seq_len={seq_len} into 2*cp={2 * cp} equal chunks (a "
                             f"front and a back one per rank); use a seq_len divisible by {2 * cp}, or cp in {fits}"))
    if m.is_moe:
        out.append(TrainerLimit("parallel.cp", cp, "context parallelism of MoE models is not supported yet (the "
                                "load-balancing loss would see each rank's tokens only); use cp=1"))
    if lay.diloco_inner_steps:
        out.append(TrainerLimit("parallel.cp", cp, "DiLoCo with context parallelism is not supported yet; "
                                "use cp=1 or diloco_inner_steps=0"))
    if compresses_in_hooks(lay.grad_compression):
        out.append(TrainerLimit("parallel.cp", cp, f"grad_compression={lay.grad_compression} does not yet reduce "
                                "across cp ranks; use grad_compression=none or bf16, or cp=1"))
    if lay.dp_replicate > 1 and lay.zero in (2, 3):  # FSDP over dp_shard x cp: HSDP's 2-D mesh is not built
        out.append(TrainerLimit("parallel.cp", cp, "HSDP (dp_replicate > 1 with zero=2/3) with context "
                                "parallelism is not supported yet; set dp_replicate=1, zero=0 or 1, or cp=1"))
    order = rank_dims(lay.rank_order)
    if lay.dp_shard > 1 and lay.zero in (2, 3) and {"dp", "cp"} <= set(order) and order.index("dp") < order.index("cp"):
        # FSDP shards over the flattened (dp_shard, cp) mesh, whose ranks are then out of order ([0, 2, 1, 3]):
        # DTensor places each shard by that order, the process group gathers them by rank, and the weights came
        # back permuted (verify: 9.0e-3 in the first step's loss, 0.13 in the weights; zero=0/1 matched).
        out.append(TrainerLimit("parallel.rank_order", lay.rank_order, f"puts dp inside cp, which FSDP (zero={lay.zero}) "
                                "over dp_shard x cp ranks cannot shard over yet; name cp before dp "
                                "(e.g. cp-dp-tp-pp) or use zero=0 or 1"))
    return out


def _compression_problems(lay: Layout) -> list[UserError]:
    c = lay.grad_compression
    if c == "none":
        return []
    if c not in GRAD_COMPRESSION:
        return [UserError("parallel.grad_compression", c, f"use one of {', '.join(GRAD_COMPRESSION)}")]
    if lay.dp == 1:
        return [UserError("parallel.grad_compression", c, "compresses the data-parallel gradient reduction but "
                          "dp_replicate*dp_shard=1; give data parallelism ranks or set grad_compression=none")]
    if not compresses_in_hooks(c) or lay.replicates_with_ddp:
        return []
    if lay.tp > 1 or lay.pp > 1 or lay.ep > 1:  # FSDP2 replicate (zero 0/1) has no hook before its all-reduce
        return [TrainerLimit("parallel.grad_compression", c, "runs on DDP or on FSDP2's zero=2/3 shards, not yet "
                             "with tp/pp/ep (each stage, tensor shard and expert group reduces on its own mesh); "
                             "use grad_compression=bf16 or a layout without tp/pp/ep")]
    if c != "int8" and lay.dp_replicate == 1:
        return [TrainerLimit("parallel.grad_compression", c, "compresses HSDP's all-reduce across dp_replicate; "
                             "with dp_replicate=1 FSDP2 only reduce-scatters (every value goes to one rank); "
                             "set parallel.dp_replicate > 1 (dp_shard within a node), or use int8 or bf16")]
    return []


def _offload_problems(lay: Layout) -> list[UserError]:
    """parallel.offload=params is FSDP2's CPUOffloadPolicy: it needs FSDP2 sharding parameters
    (zero 2/3 over dp_shard > 1); DDP and FSDP2's `replicate` have no offload. Optimizer-only offload
    is not built: torch's AdamW wants its state on the parameter's device."""
    o = lay.offload
    if o == "none":
        return []
    if o not in OFFLOAD:
        return [UserError("parallel.offload", o, f"use one of {', '.join(OFFLOAD)}")]
    if o == "optimizer":
        return [TrainerLimit("parallel.offload", o, "optimizer-only offload is not built yet; use offload=params "
                             "(parameters, gradients and the optimizer step on the host, zero 2/3) or none")]
    if lay.dp_shard < 2 or lay.zero < 2:
        return [UserError("parallel.offload", o, f"runs on FSDP2 sharding (zero 2/3 with dp_shard > 1), but zero="
                          f"{lay.zero} dp_shard={lay.dp_shard} runs on {'DDP' if lay.replicates_with_ddp else 'replication'}; "
                          "set parallel.zero=3 and dp_shard >= 2, or offload=none")]
    if compresses_in_hooks(lay.grad_compression):
        return [TrainerLimit("parallel.offload", o, f"grad_compression={lay.grad_compression} compresses on the "
                             "accelerator in FSDP2's hooks, before offloaded gradients reach the host; use "
                             "grad_compression=none or bf16")]
    return []


def _diloco_problems(lay: Layout) -> list[UserError]:
    """DiLoCo replaces the gradient all-reduce across dp_replicate groups with an outer step every H
    steps (parallel/diloco.py). It composes with tp, pp and dp_shard (each group shards alike, so
    the ranks at one coordinate hold the same slices). Not with grad_compression: inside a group
    gradients cross the fast links, and the slow cross-group traffic is the pseudo-gradient, which
    parallel.diloco_quantize compresses."""
    h = lay.diloco_inner_steps
    if h == 0:
        return []
    if lay.dp_replicate < 2:
        return [UserError("parallel.diloco_inner_steps", h, "DiLoCo averages across dp_replicate groups but "
                          f"dp_replicate={lay.dp_replicate}; set parallel.dp_replicate to 2 or more, or diloco_inner_steps=0")]
    if lay.grad_compression != "none":
        return [UserError("parallel.grad_compression", lay.grad_compression, "DiLoCo sends no gradients across "
                          "groups; compress its pseudo-gradient with parallel.diloco_quantize=bf16|int8|fp4 and set "
                          "grad_compression=none")]
    if lay.ep > 1:
        return [TrainerLimit("parallel.ep", lay.ep, "expert weights are sharded across dp_replicate, which DiLoCo "
                             "keeps apart; set ep=1 or diloco_inner_steps=0")]
    if lay.zero == 1:
        return [TrainerLimit("parallel.zero", 1, "ZeRO-1 shards the optimizer across all data-parallel ranks, "
                             "DiLoCo keeps each group's own; use zero=0, 2 or 3")]
    return []


def _pipeline_problems(lay: Layout, m: ModelConfig) -> list[UserError]:
    out = []
    if lay.pp_schedule not in SCHEDULES:
        return [UserError("parallel.pp_schedule", lay.pp_schedule, f"use one of {', '.join(SCHEDULES)}")]
    if lay.pp_schedule in PLAN_ONLY_SCHEDULES:
        out.append(TrainerLimit("parallel.pp_schedule", lay.pp_schedule, "shoal train has no DualPipe schedule in "
                                "this build (shoal plan plans it for other trainers); use zero-bubble or "
                                "interleaved-1f1b"))
        if lay.pp % 2:  # rank i pairs with rank pp-1-i (DeepSeek-V3 §3.2.1: stages divisible by 2)
            out.append(UserError("parallel.pp", lay.pp, "dualpipe pairs pipeline rank i with rank pp-1-i, so pp "
                                 "must be even; use an even pp or another schedule"))
    if lay.pp_schedule in INTERLEAVED and lay.pp == 1:
        out.append(UserError("parallel.pp_schedule", lay.pp_schedule, "interleaving needs pp > 1; raise parallel.pp "
                             "or use 1f1b"))
    if lay.pp_virtual_stages > 1 and lay.pp_schedule not in INTERLEAVED:
        out.append(UserError("parallel.pp_virtual_stages", lay.pp_virtual_stages,
                             f"only {' and '.join(INTERLEAVED)} have virtual stages; set parallel.pp_schedule "
                             f"or pp_virtual_stages=1"))
    stages = lay.pp * lay.virtual_stages
    if lay.pp > 1 and lay.virtual_stages > 1 and m.n_layers < stages <= max_pipeline_stages(m.n_layers):
        # Megatron's --account-for-embedding/loss-in-pipeline-split counts the embedding and the head as
        # one layer each, so the first and the last stage may hold only them (Llama 3 405B: 126 layers
        # in 16x8 stages, "one Transformer layer less" on the first and last, §3.3.2).
        fix = (f"lower parallel.pp_virtual_stages to at most {m.n_layers // lay.pp}" if m.n_layers // lay.pp >= 2
               else "use pp_schedule=1f1b")
        out.append(TrainerLimit("parallel.pp_virtual_stages", lay.pp_virtual_stages,
                                f"{stages} pipeline stages (pp*virtual stages) for n_layers={m.n_layers} leave the "
                                f"first and last stage only the embedding and the head, which shoal train's split "
                                f"does not make; {fix}"))
    elif lay.pp > 1 and stages > m.n_layers:
        if lay.virtual_stages == 1:
            fix = f"use at most pp={m.n_layers}"
        elif m.n_layers // lay.pp >= 2:  # interleaving: lower the stages per rank first, pp stays
            fix = f"lower parallel.pp_virtual_stages to at most {m.n_layers // lay.pp}"
        elif m.n_layers >= 4:
            fix = f"interleaving needs 2 stages per rank: use at most pp={m.n_layers // 2}, or pp_schedule=1f1b"
        else:
            fix = "use pp_schedule=1f1b (interleaving needs 2 stages per rank)"
        out.append(UserError("parallel.pp", lay.pp, f"{stages} pipeline stages (pp*virtual stages = {lay.pp}*"
                             f"{lay.virtual_stages}) but only n_layers={m.n_layers}; {fix}"))
    if lay.pp > 1 and m.tie_embeddings:
        out.append(TrainerLimit("model.tie_embeddings", True,
                             "tied embeddings cannot span pipeline stages; use pp=1, or set it false for a "
                             "model built from scratch (a model folder that ties them keeps them tied)"))
    return out


def _batch_problems(lay: Layout, global_batch: int) -> list[UserError]:
    unit = lay.micro_batch * lay.dp
    if global_batch % unit:
        per_rank = global_batch // lay.dp
        if global_batch % lay.dp == 0:
            upper = (global_batch // unit + 1) * unit
            hint = f"try train.micro_batch in {divisors_upto(per_rank, per_rank)} or train.global_batch={upper}"
        else:
            hint = f"try train.global_batch={multiples_near(global_batch, unit)}"
        return [UserError("train.global_batch", global_batch,
                          f"must be a multiple of micro_batch*dp = {lay.micro_batch}*{lay.dp} = {unit}; {hint}")]
    if lay.pp == 1:
        return []
    per_rank = global_batch // lay.dp
    n = lay.microbatches(global_batch)
    field = "parallel.pp_microbatches" if lay.pp_microbatches else "train.micro_batch"
    value = lay.pp_microbatches or lay.micro_batch
    if per_rank % n:
        return [UserError(field, value, f"{n} micro-batches must divide the {per_rank} sequences each "
                          f"data-parallel rank gets per step")]
    if lay.pp_schedule == "dualpipe" and (n % 2 or n < 2 * lay.pp):
        # Half the micro-batches enter at each end, and each end's warm-up fills the pipeline before the paired
        # steady state (deepseek-ai/DualPipe asserts num_chunks % 2 == 0 and num_chunks >= 2 * num_ranks).
        fit = [mb for mb in divisors_upto(per_rank, per_rank)
               if per_rank // mb >= 2 * lay.pp and per_rank // mb % 2 == 0]
        fix = (f"set train.micro_batch={fit[-1]}" if fit and not lay.pp_microbatches
               else f"raise train.global_batch to {2 * lay.pp * lay.micro_batch * lay.dp}")
        return [UserError(field, value, f"dualpipe needs an even number of micro-batches per step, at least "
                          f"2*pp={2 * lay.pp} (half enter at each end), this gives {n}; {fix}")]
    # torch.distributed.pipelining's schedules need these two; a pipeline with fewer micro-batches than
    # stages, or interleaving without a multiple of pp, is still sound (Megatron's 1F1B warms up with
    # min(pp - rank - 1, m); Llama 3 made both flexible, §3.3.2): trainer limits, not errors.
    if lay.pp_schedule != "gpipe" and n < lay.pp:
        fit = [mb for mb in divisors_upto(per_rank, per_rank) if per_rank // mb >= lay.pp]
        fix = (f"set train.micro_batch={fit[-1]}" if fit and not lay.pp_microbatches
               else f"raise train.global_batch to {lay.pp * lay.micro_batch * lay.dp}")
        return [TrainerLimit(field, value, f"{lay.pp_schedule} needs at least pp={lay.pp} micro-batches per step "
                             f"to fill the pipeline, this gives {n}; {fix}")]
    if lay.pp_schedule in INTERLEAVED and n % lay.pp:
        return [TrainerLimit(field, value, f"{lay.pp_schedule} needs a multiple of pp={lay.pp} micro-batches per "
                             f"step, this gives {n}")]
    return []


def max_pipeline_stages(n_layers: int) -> int:
    """The most pipeline stages (pp x virtual stages) a model of n_layers can be planned with: one a layer,
    and the first and last stage holding only the embedding and the head (a trainer limit beyond n_layers)."""
    return n_layers + 2


def check(lay: Layout, model: ModelConfig, world: int, global_batch: int, seq_len: int) -> Layout:
    """Raise the first problem, if any; otherwise return the layout."""
    found = problems(lay, model, world, global_batch, seq_len)
    if found:
        raise found[0]
    return lay


def factorizations(world: int) -> str:
    """A few tp x pp x dp factorizations of world, as a hint."""
    options = [f"tp={tp} pp={pp} dp={world // (tp * pp)}"
               for tp in (1, 2, 4, 8) for pp in (1, 2, 4, 8) if world % (tp * pp) == 0]
    return "; ".join(options[:6])


def splits_heads(m, tp: int) -> bool:
    """tp divides the query heads, and the kv heads either split evenly over the ranks or, with more
    ranks than kv heads, are replicated: tp/n_kv_heads ranks compute each (parallel/tensor_parallel.py)."""
    return m.n_heads % tp == 0 and (m.n_kv_heads % tp == 0 or tp % m.n_kv_heads == 0)


def divisors_upto(n: int, upto: int) -> list[int]:
    return [d for d in range(1, min(n, max(upto, 1)) + 1) if n % d == 0]


def multiples_near(n: int, unit: int) -> str:
    """The multiples of `unit` either side of `n` to offer in a hint, "48 or 64"; only the one above
    when none is below (n < unit), not "64 or 64"."""
    lower, upper = n // unit * unit, (n // unit + 1) * unit
    return f"{lower} or {upper}" if lower else str(upper)
