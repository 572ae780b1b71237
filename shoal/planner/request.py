"""What `shoal plan` is asked, turned into the planner's inputs and answered.

`args` is anything with the flags' names as attributes (the CLI's argparse namespace): `build`
checks them and makes the workload, the cluster and the dimensions the user fixed; `answer` runs
the search (or evaluates the one layout every flag pins), the budget with --tokens and the scaling
sweep with --scale. A mistake is a UserError naming the flag, before any search. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from shoal import hardware
from shoal.errors import UserError
from shoal.hardware import local as local_hardware
from shoal.layout import MAX_GPUS, Layout, TrainerLimit
from shoal.layout_rules import multiples_near, problems
from shoal.setting_rules import ENABLED_BY, ignored_settings, slow_link_setting_problems
from shoal.model.config import ModelConfig, get_preset
from shoal.planner import cost, energy, scaling
from shoal.planner.context_parallel import heads_problem
from shoal.planner.evaluate import Plan
from shoal.planner.search import Fixed, SearchResult, evaluate_pinned, search
from shoal.planner.stacks import STACK_SETTINGS, default_stack, stack_settings
from shoal.planner.workload import Cluster, Workload


@dataclass(frozen=True)
class Inputs:
    workload: Workload
    cluster: Cluster
    """With --scale and no --gpus, one GPU (the sweep sets the counts)."""
    fixed: Fixed
    """The dimensions the flags pin; the search fills the rest."""
    name: str
    """The model as the output names it: the preset, or its shape."""
    scale: tuple[int, int] | None = None
    """--scale A:B, checked before any search (scaling.parse_scale)."""


def _flag_of(dest: str) -> str:
    """The flag argparse stores as `dest` (`--etp` for expert_tp, as in_flags names parallel.expert_tp)."""
    return "--etp" if dest == "expert_tp" else "--" + dest.replace("_", "-")


def _positive(dest: str, value, fix: str = ""):
    """None is a flag not given; anything else must be a count, named by its flag (`--tp=0`, not `tp=0`)."""
    if value is not None and value < 1:
        raise UserError(_flag_of(dest), value, "must be a positive integer" + (f"; {fix}" if fix else ""))


def build_model(args) -> ModelConfig:
    """--model PRESET (or a model folder) with any shape flag over it, or the shape alone; a mistake
    names the flag typed."""
    # 0 in the config means "the default width" (model.head_dim, model.expert_ffn_hidden); as a flag it was
    # silently that, where leaving the flag out says so
    for dest, default in (("head_dim", "hidden/heads"), ("expert_ffn_hidden", "--ffn-hidden")):
        _positive(dest, getattr(args, dest), f"leave {_flag_of(dest)} out for the preset's width, or {default}")
    if args.model and ("/" in args.model or Path(args.model).expanduser().is_dir()):
        from shoal.pretrained import open_pretrained  # its config.json (or shoal_model.json); no weights read

        cfg = open_pretrained(args.model, field="model", shape_only=True).model
    elif args.model:
        cfg = get_preset(args.model)
    elif None in (args.layers, args.hidden, args.heads):
        missing = [f"--{n}" for n, v in (("layers", args.layers), ("hidden", args.hidden), ("heads", args.heads))
                   if v is None]
        raise UserError("--model", args.model, f"give --model PRESET, or the shape: {' '.join(missing)} missing")
    else:
        mlp = args.mlp or "swiglu"
        ffn = args.ffn_hidden or (4 * args.hidden if mlp == "gelu" else 256 * -(-8 * args.hidden // 3 // 256))
        cfg = ModelConfig(vocab_size=32000, dim=args.hidden, n_layers=args.layers, n_heads=args.heads,
                          n_kv_heads=args.heads, ffn_hidden=ffn, mlp=mlp, max_seq_len=args.seq_len, n_experts=0)
    changes = {field: getattr(args, flag) for field, flag in SHAPE_FLAGS.items() if getattr(args, flag) is not None}
    if args.model and "n_heads" in changes and "n_kv_heads" not in changes and cfg.n_heads % cfg.n_kv_heads:
        changes["n_kv_heads"] = changes["n_heads"]
    base = cfg
    if changes:
        cfg = cfg.replace(**changes, note="")
    try:
        return cfg.validate(base=base)
    except UserError as e:  # name the flags the user typed, not the config fields behind them
        field = e.field.removeprefix("model.")
        if field in changes and field in SHAPE_FLAGS:
            fix = re.sub(r"model\.(\w+)", lambda m: _flag(m[1]) if m[1] in SHAPE_FLAGS else m[0], e.fix)
            raise UserError(_flag(field), e.value, fix) from None
        raise


def _flag(field: str) -> str:
    return _flag_of(SHAPE_FLAGS[field])


SHAPE_FLAGS = {"n_layers": "layers", "dim": "hidden", "n_heads": "heads", "n_kv_heads": "kv_heads",
               "head_dim": "head_dim", "qk_norm": "qk_norm", "ffn_hidden": "ffn_hidden", "vocab_size": "vocab",
               "mlp": "mlp", "n_experts": "experts", "top_k": "top_k",
               "expert_ffn_hidden": "expert_ffn_hidden", "n_shared_experts": "shared_experts"}
"""ModelConfig field -> the `shoal plan` flag (argparse's name) that sets it."""


def build(args) -> Inputs:
    """The flags -> the planner's inputs, every one checked before any search."""

    for name in ("seq_len", "global_batch"):
        if getattr(args, name) is None:
            raise UserError(_flag_of(name), None, f"give {_flag_of(name)} N (or --validate RUN_DIR)")
    for name in ("seq_len", "global_batch", "gpus", "gpus_per_node", "tp", "cp", "pp", "dp", "dp_replicate", "ep",
                 "micro_batch", "pp_virtual_stages"):
        _positive(name, getattr(args, name))
    if args.gpus and args.gpus > MAX_GPUS:  # the Cluster's bound, said in the flag typed
        raise UserError("--gpus", args.gpus, f"must be from 1 to {MAX_GPUS:,}")
    if args.expert_tp:  # 0: experts split as each layout implies (parallel.expert_tp's default)
        _positive("expert_tp", args.expert_tp, "or 0 to split the experts as each layout does")
    cfg = build_model(args)
    if args.hw_file:
        gpu = hardware.load_hw_file(args.hw_file, args.gpu)
    elif args.gpu:
        gpu = hardware.get_gpu(args.gpu, remeasure=args.remeasure)
    else:
        raise UserError("--gpu", args.gpu, f"name a device with --gpu ({', '.join(hardware.known_names())}) or "
                                           "--hw-file")
    if args.hw:
        gpu = hardware.apply_overrides(gpu, hardware.parse_hw_flags(args.hw))
    if args.gpus:  # `local`: the ranks share this machine's cores unless --gpus-per-node spreads them
        gpu = local_hardware.local_for_ranks(gpu, args.gpus_per_node or args.gpus)
    if args.gpus is None and args.scale is None:
        raise UserError("--gpus", None, "give the GPU count with --gpus N (or sweep with --scale A:B)")
    scale = scaling.parse_scale(args.scale) if args.scale is not None else None  # "" too: not a sweep
    precision = args.precision or ("fp32" if local_hardware.is_local(gpu) else "bf16")
    if precision == "fp8" and not gpu.peak_fp8_flops:
        raise UserError("--precision", "fp8", f"{gpu.name} has no FP8 tensor cores; use bf16, or give its FP8 peak "
                                            f"with --hw peak_fp8_flops=...")
    _slow_link_flags(args)
    kernels = args.kernels or ("eager" if local_hardware.is_local(gpu) else "fused")
    # The local CPU, and a plan written as a recipe (--emit), plan shoal train as it runs (Workload.of_job);
    # otherwise the stack named, or the one the pinned layout implies (stacks.default_stack).
    plans_shoal = local_hardware.is_local(gpu) or bool(getattr(args, "emit", None))
    if getattr(args, "emit", None) and args.stack not in (None, "shoal"):
        raise UserError("--stack", args.stack, "--emit writes a recipe that shoal train runs, so it plans the shoal "
                                             "stack; drop --stack (or plan without --emit)")
    given = {name: getattr(args, name) for name in STACK_SETTINGS}
    for switch in ("grad_overlap", "pp_overlap", "offload_overlap"):  # on/off flags, booleans in the Workload
        given[switch] = None if given[switch] is None else given[switch] == "on"
    stack = args.stack or ("shoal" if plans_shoal else default_stack(bool(gpu.xla_step), args.zero))
    workload = Workload(cfg, args.seq_len, args.global_batch, precision=precision, kernels=kernels,
                        document_mask=args.document_mask, **stack_settings(stack, given), stack=stack,
                        grad_compression=args.grad_compression, topk_density=args.topk_density,
                        powersgd_rank=args.powersgd_rank, diloco_inner_steps=args.diloco_inner_steps,
                        diloco_quantize=args.diloco_quantize, diloco_overlap_steps=args.diloco_overlap_steps)
    per_node = args.gpus_per_node or gpu.gpus_per_node
    n = args.gpus or 0
    if args.gpus_per_node and n > per_node and n % per_node:  # a node size the user gave, not the catalog's
        raise UserError("--gpus", n, f"is not a whole number of nodes of {per_node} GPUs (--gpus-per-node); use "
                                   f"--gpus {n // per_node * per_node} or {(n // per_node + 1) * per_node}, or a "
                                   f"--gpus-per-node that divides {n}")
    cluster = Cluster(gpu, args.gpus, per_node) if args.gpus else Cluster(gpu, 1, per_node)
    schedule = args.pp_schedule
    if schedule is None and args.pp_virtual_stages and args.pp_virtual_stages > 1:
        schedule = "interleaved-1f1b"  # asking for virtual stages means interleaving
    zero = 0 if args.diloco_inner_steps else args.zero  # DiLoCo plans replica groups of one rank
    # A pinned --dp is one ZeRO group unless --dp-replicate splits it (a published "DP 512" is flat); with dp
    # left to the search, so are HSDP's groups.
    replicas = args.dp_replicate or (1 if args.dp else None)
    fixed = Fixed(dp=args.dp, dp_replicate=replicas, tp=args.tp, pp=args.pp, ep=args.ep, expert_tp=args.expert_tp,
                  zero=zero,
                  micro_batch=args.micro_batch,
                  activation_checkpoint=args.activation_checkpoint, pp_schedule=schedule,
                  pp_virtual_stages=args.pp_virtual_stages, sequence_parallel=args.sequence_parallel,
                  cp=args.cp, offload=args.offload, activation_offload=args.activation_offload)
    if args.gpus:
        _check_pinned(fixed, args.gpus, workload)
    name = args.model or f"custom {cfg.n_layers}L/{cfg.dim}H/{cfg.n_heads}A"
    return Inputs(workload, cluster, fixed, name, scale)


def ignored_flags(args) -> list[str]:
    """The flags that their switch leaves off, so they change nothing in the plan (setting_rules.ENABLED_BY,
    as `shoal train` says of its settings). A switch not given (None) is searched: it judges nothing."""
    defaults = {f.name: f.default for f in (*fields(Workload), *fields(Layout))}
    given = {name: getattr(args, name, None) for name in {*ENABLED_BY, *(switch for switch, _ in ENABLED_BY.values())}}
    return ignored_settings(given, defaults, name=lambda field: "--" + field.replace("_", "-"))


def _slow_link_flags(args) -> None:
    for problem in slow_link_setting_problems(args.topk_density, args.powersgd_rank, args.diloco_inner_steps,
                                              args.diloco_overlap_steps, name=_flag_of):
        raise problem
    if args.diloco_inner_steps and args.grad_compression != "none":
        raise UserError("--grad-compression", args.grad_compression, "DiLoCo sends no gradients across replica groups; "
                        "use --diloco-quantize for its pseudo-gradient")
    if args.diloco_inner_steps and args.dp_replicate not in (None, 1):
        raise UserError("--dp-replicate", args.dp_replicate, "the planner's DiLoCo makes each data-parallel rank its "
                        "own replica group; drop --dp-replicate")
    if args.diloco_inner_steps and args.zero not in (None, 0):
        raise UserError("--zero", args.zero, "the planner's DiLoCo makes each data-parallel rank its own replica "
                        "group, which replicates (zero=0); drop --zero")


def _check_pinned(fixed, n_gpus: int, workload) -> None:
    """The pinned dimensions alone must fit the model, the batch and the GPU count."""
    # The layout rules are shoal/layout_rules.py's (the search applies them to whole layouts); the pinned
    # tp and pp alone are checked first so their own mistake is named before the GPU arithmetic.
    probe = Layout(tp=fixed.tp or 1, cp=fixed.cp or 1, pp=fixed.pp or 1, zero=0, pp_schedule="gpipe")
    for p in problems(probe, workload.model, probe.world, workload.global_batch, workload.seq_len):
        if p.field in ("parallel.tp", "parallel.cp", "parallel.pp") and not isinstance(p, TrainerLimit):
            raise p
    if fixed.dp and fixed.dp_replicate and fixed.dp % fixed.dp_replicate:
        raise UserError("--dp-replicate", fixed.dp_replicate, f"must divide --dp {fixed.dp} (each replica group shards "
                        f"over dp/dp-replicate ranks); try a divisor of {fixed.dp}")
    if fixed.dp and fixed.dp_replicate == fixed.dp > 1 and fixed.zero in (2, 3):
        raise UserError("--dp-replicate", fixed.dp_replicate,
                        f"leaves one rank per replica group, which has nothing to shard under --zero {fixed.zero}; use "
                        f"--zero 0 (replicate everywhere) or a --dp-replicate that divides --dp {fixed.dp} into groups "
                        "of 2 or more")
    if fixed.dp_replicate and n_gpus % fixed.dp_replicate:
        raise UserError("--dp-replicate", fixed.dp_replicate, f"must divide --gpus {n_gpus}")
    if fixed.cp and fixed.tp and (problem := heads_problem(workload.model, fixed.tp, fixed.cp, workload.cp_comm)):
        raise problem
    pinned = {k: getattr(fixed, k) for k in ("dp", "tp", "cp", "pp") if getattr(fixed, k)}
    product = 1
    for v in pinned.values():
        product *= v
    # in the flags typed: "--tp 8 x --pp 3 = 24", "--pp 3"
    expr = " x ".join(f"--{k} {v}" for k, v in pinned.items()) + (f" = {product}" if len(pinned) > 1 else "")
    if pinned and n_gpus % product:
        raise UserError("--gpus", n_gpus, f"must be divisible by {expr}; try --gpus {multiples_near(n_gpus, product)}")
    if {"dp", "tp", "pp"} <= set(pinned) and (fixed.cp or 1) * fixed.dp * fixed.tp * fixed.pp != n_gpus:
        raise UserError("--gpus", n_gpus, f"{expr} ranks, not {n_gpus}; change --dp, --tp, --cp or --pp")


def carbon_inputs(args, cluster: Cluster):
    """Check --pue, --region and --carbon-trace (and that they and --mtbf-hours come with --tokens) before the
    sweep; (the PUE, the trace if one is given)."""
    pue = energy.DEFAULT_PUE if args.pue is None else energy.check_pue(args.pue)
    if args.region:
        energy.region_intensity(args.region)
    if args.region and args.carbon_trace:
        raise UserError("--region", args.region, "give --region (an annual average) or --carbon-trace (hourly), "
                                                 "not both")
    # --pue and --mtbf-hours change only a run's budget too: without --tokens they were taken and dropped unsaid
    whole_run = [flag for flag, given in (("--region", args.region), ("--carbon-trace", args.carbon_trace),
                                          ("--pue", args.pue is not None), ("--mtbf-hours", args.mtbf_hours is not None))
                 if given]
    if whole_run and not args.tokens:
        raise UserError("--tokens", None, f"{whole_run[0]} is for a whole run (its energy, CO2 or failures): give its "
                                          "size with --tokens (e.g. 1T)")
    if (args.region or args.carbon_trace) and not cluster.gpu.board_watts:
        raise UserError("hw.power_watts", 0, f"{cluster.gpu.name} has no power figure; set one with "
                                             "--hw power_watts=700")
    return pue, energy.read_trace(args.carbon_trace) if args.carbon_trace else None


VALIDATE_FLAGS = {"validate", "recipe", "overrides", "gpu", "gpus", "gpus_per_node", "hw", "hw_file", "remeasure",
                  "json"}
"""The flags --validate reads; any other flag shapes a new plan, and a run's comparison would drop it silently."""


def validate_hardware(args, defaults: dict):
    """--validate's flags checked (any other flag given would be dropped silently); the hardware to plan
    the run on anew (--gpu, --hw-file, --hw), or None for the prediction the run stored."""
    for dest, default in defaults.items():
        if dest not in VALIDATE_FLAGS and dest != "plan_defaults" and getattr(args, dest, default) != default:
            flag = "--" + dest.replace("_", "-")
            raise UserError(flag, getattr(args, dest), "--validate compares a finished run with its prediction, so "
                            f"{flag} has no effect there; drop it, or plan anew without --validate")
    for name in ("gpus", "gpus_per_node"):  # 0 would read as "not given", the run's own
        _positive(name, getattr(args, name))
    gpu = None
    if args.hw_file:
        gpu = hardware.load_hw_file(args.hw_file, args.gpu)
    elif args.gpu or args.hw or args.remeasure:
        gpu = hardware.get_gpu(args.gpu or "local", remeasure=args.remeasure)
    if args.hw:
        gpu = hardware.apply_overrides(gpu, hardware.parse_hw_flags(args.hw))
    return gpu


@dataclass
class Answer:
    inputs: Inputs
    result: SearchResult | None = None
    """The search, when a dimension was left to it."""
    single: Plan | None = None
    """The one layout every flag pinned, evaluated."""
    price: float | None = None
    """$ per GPU-hour: --usd-per-gpu-hour, else the catalog's list price (None: unknown)."""
    training: cost.TrainingEstimate | None = None
    used: energy.Energy | None = None
    window: energy.Window | None = None
    points: list | None = None
    """The --scale sweep."""
    budget: object = None
    """plan -> (time-to-train and cost, energy and CO2) with --tokens, for each plan of the JSON."""

    @property
    def best(self) -> Plan | None:
        return self.single or (self.result.best if self.result else None)


def answer(args, inputs: Inputs) -> Answer:
    """The search or the pinned layout, then with --tokens its budget and energy (and the best hour to
    start it, with a --carbon-trace), then the --scale sweep."""
    workload, cluster, fixed = inputs.workload, inputs.cluster, inputs.fixed
    ans = Answer(inputs)
    if args.gpus:
        if fixed.complete and (fixed.ep or not workload.model.is_moe):
            replicas = fixed.dp_replicate or 1
            layout = Layout(dp_replicate=replicas, dp_shard=fixed.dp // replicas, tp=fixed.tp, cp=fixed.cp or 1,
                            pp=fixed.pp, ep=fixed.ep or 1, expert_tp=fixed.expert_tp or 0, zero=fixed.zero,
                            offload=fixed.offload or "none", activation_offload=bool(fixed.activation_offload),
                            micro_batch=fixed.micro_batch, pp_schedule=fixed.pp_schedule or "1f1b",
                            pp_virtual_stages=fixed.pp_virtual_stages or 1,
                            activation_checkpoint=fixed.activation_checkpoint,
                            sequence_parallel=(fixed.tp > 1 if fixed.sequence_parallel is None
                                               else fixed.sequence_parallel))
            ans.single = evaluate_pinned(workload, layout, cluster,
                                         interleave_given=fixed.pp_virtual_stages is not None)
        else:
            ans.result = search(workload, cluster, fixed, rank_by=args.rank_by, keep=max(args.top, 10))
    # No price given: the catalog's on-demand list price for the device (hardware.py), if it has one.
    ans.price = args.usd_per_gpu_hour if args.usd_per_gpu_hour is not None else (cluster.gpu.usd_per_gpu_hour or None)
    pue, trace = carbon_inputs(args, cluster)

    def budget(plan):
        est = cost.estimate(
            args.tokens, plan.tokens_per_s, cluster.n_gpus, usd_per_gpu_hour=ans.price,
            mtbf_gpu_hours=cost.DEFAULT_MTBF_GPU_HOURS if args.mtbf_hours is None else args.mtbf_hours,
            checkpoint_interval_hours=args.checkpoint_every_min / 60, restart_hours=args.restart_min / 60,
            checkpoint_write_hours=args.checkpoint_write_min / 60)
        return est, energy.run_energy(est, cluster, pue=pue, region=args.region, trace=trace)

    if args.tokens:
        ans.budget = budget
        if ans.best and ans.best.fits:
            ans.training, ans.used = budget(ans.best)
    if trace is not None and ans.used is not None:
        ans.window = energy.best_start(trace, ans.used.hours)
    if inputs.scale:
        a, b = inputs.scale
        ans.points = scaling.sweep(workload, cluster, scaling.gpu_counts(a, b), fixed, base_gpus=args.gpus or a,
                                   rank_by=args.rank_by)
    return ans
