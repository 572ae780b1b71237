"""`shoal plan`: predict memory, step time, MFU, time-to-train and cost; search layouts; scaling curve.

Parsing and rendering only; the planner lives in shoal/planner. Never imports torch.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys

from shoal.cli.argtypes import check_output_dir, check_output_file, non_empty, nonnegative_float, positive_float
from shoal.errors import UserError
from shoal.layout import ACTIVATION_CHECKPOINT, DILOCO_QUANTIZE, GRAD_COMPRESSION, SCHEDULES
from shoal.planner.layout import PRECISIONS

EPILOG = """examples:
  shoal plan --model llama3-8b --seq-len 8192 --global-batch 512 --gpu h100 --gpus 64
  shoal plan --model llama3-405b --seq-len 8192 --global-batch 2048 --gpu h100 --gpus 16384 --tokens 15e12 --usd-per-gpu-hour 2
  shoal plan --model llama3-70b --seq-len 4096 --global-batch 1024 --gpu h100 --gpus 512 --tp 8 --pp 4 --dp 16 \\
             --zero 1 --micro-batch 1 --activation-checkpoint selective --emit recipes/plan-70b.toml
  shoal plan --model llama3-70b --seq-len 4096 --global-batch 1024 --gpu h100 --scale 8:16384 --figures runs/plan
"""


def register(sub) -> None:
    p = sub.add_parser("plan", help="predict memory/time/MFU/cost of parallel layouts and search them",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("model (a preset, or the shape)")
    m.add_argument("--model", metavar="PRESET", help="a preset from `shoal presets`; shape flags override its fields")
    m.add_argument("--layers", type=int)
    m.add_argument("--hidden", type=int)
    m.add_argument("--heads", type=int)
    m.add_argument("--kv-heads", type=int, help="default: --heads (multi-head attention)")
    m.add_argument("--ffn-hidden", type=int, help="default: 4H for gelu, ~8H/3 rounded to 256 for swiglu")
    m.add_argument("--vocab", type=int, help="default 32000")
    m.add_argument("--mlp", choices=("swiglu", "gelu"))
    m.add_argument("--experts", type=int)
    m.add_argument("--top-k", type=int)
    m.add_argument("--expert-ffn-hidden", type=int)
    m.add_argument("--shared-experts", type=int)

    w = p.add_argument_group("workload and cluster")
    w.add_argument("--seq-len", type=int, help="tokens per sequence (required unless --validate)")
    w.add_argument("--global-batch", type=int, help="sequences per optimizer step (required unless --validate)")
    w.add_argument("--gpu", metavar="NAME", help="a100, a100-40gb, h100, h800, h200, b200, mi300x, tpu-v5p, tpu-v4, local")
    w.add_argument("--gpus", type=int, help="GPU count (optional with --scale)")
    w.add_argument("--gpus-per-node", type=int)
    w.add_argument("--precision", choices=PRECISIONS,
                   help="default bf16 (mixed precision); fp32 with --gpu local, as CPUs train in fp32; fp8: GEMMs "
                        "in FP8 (Transformer Engine), the rest as bf16; MFU stays against the BF16 peak")
    w.add_argument("--attention", choices=("flash", "unfused"), default="flash",
                   help="unfused: S×S scores in memory, as Megatron-LM before flash attention (default flash)")
    w.add_argument("--hw", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a hardware field, e.g. --hw inter_node_bandwidth=25e9 (repeatable)")
    w.add_argument("--hw-file", metavar="TOML", type=non_empty("--hw-file hw.toml"),
                   help="hardware fields in TOML (base = \"h100-sxm\" + overrides)")
    w.add_argument("--remeasure", action="store_true", help="with --gpu local: measure this machine again")

    lay = p.add_argument_group("layout (a flag fixes that dimension; the rest are searched)")
    lay.add_argument("--tp", type=int)
    lay.add_argument("--pp", type=int)
    lay.add_argument("--dp", type=int)
    lay.add_argument("--ep", type=int)
    lay.add_argument("--zero", type=int, choices=(0, 1, 2, 3))
    lay.add_argument("--micro-batch", type=int)
    lay.add_argument("--activation-checkpoint", "--recompute", dest="activation_checkpoint",
                     choices=ACTIVATION_CHECKPOINT, help="train.activation_checkpoint (--recompute is an alias)")
    lay.add_argument("--pp-schedule", choices=SCHEDULES)
    lay.add_argument("--pp-virtual-stages", "--pp-virtual", dest="pp_virtual_stages", type=int,
                     help="stages per pipeline rank (interleaved schedules)")
    lay.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)

    s = p.add_argument_group("slow links (change the data-parallel communication term, planner/slow_links.py)")
    s.add_argument("--grad-compression", choices=GRAD_COMPRESSION, default="none", help="as parallel.grad_compression")
    s.add_argument("--topk-density", type=float, default=0.1, help="--grad-compression topk: share of values sent")
    s.add_argument("--powersgd-rank", type=int, default=4, help="--grad-compression powersgd: rank")
    s.add_argument("--diloco-inner-steps", type=int, default=0, metavar="H",
                   help="DiLoCo: each data-parallel rank a replica group (zero=0) that all-reduces its parameters "
                        "every H steps instead of gradients every step")
    s.add_argument("--diloco-quantize", choices=DILOCO_QUANTIZE, default="none",
                   help="DiLoCo: dtype of the pseudo-gradient on the wire")
    s.add_argument("--diloco-overlap-steps", type=int, default=0, metavar="TAU",
                   help="DiLoCo: the parameters' all-reduce runs beside this many inner steps (1 to H-1)")

    o = p.add_argument_group("budget and output")
    o.add_argument("--tokens", type=_amount, help="tokens to train, e.g. 15e12 or 15T")
    o.add_argument("--usd-per-gpu-hour", type=nonnegative_float, help="default: the catalog's on-demand list price")
    o.add_argument("--mtbf-hours", type=positive_float, default=None,
                   help="per-GPU mean time between failures (default 50000)")
    o.add_argument("--checkpoint-every-min", type=positive_float, default=60.0)
    o.add_argument("--checkpoint-write-min", type=nonnegative_float, default=1.0, help="blocking checkpoint write time")
    o.add_argument("--restart-min", type=nonnegative_float, default=15.0)
    o.add_argument("--rank-by", choices=("throughput", "cost"), default="throughput",
                   help="at a fixed GPU count both give the same order; --scale then shows $/M tokens per count")
    o.add_argument("--region", type=non_empty("--region us"),
                   help="grid region for CO2 (annual average gCO2/kWh, shoal/planner/energy.py)")
    o.add_argument("--pue", type=float, help="data-centre power usage effectiveness (default 1.2, see energy.py)")
    o.add_argument("--carbon-trace", metavar="CSV", type=non_empty("--carbon-trace grid.csv"),
                   help="hourly grid intensity (time,gco2_per_kwh per line): pick the start hour with least CO2")
    o.add_argument("--top", type=int, default=10)
    o.add_argument("--json", action="store_true", help="print JSON instead of tables")
    o.add_argument("--emit", metavar="FILE", type=non_empty("--emit recipes/plan.toml"),
                   help="write the best layout as a `shoal train` recipe (TOML)")
    o.add_argument("--scale", metavar="A:B", help="sweep GPU counts A, 2A, ... B at fixed global and per-GPU batch")
    o.add_argument("--figures", metavar="DIR", type=non_empty("--figures runs/plan"),
                   help="save memory/time/scaling pictures (PNG and SVG) here")
    o.add_argument("--report", metavar="DIR", type=non_empty("--report runs/plan-report"),
                   help="write a page with the best layout's rank grid, memory, step time and scaling pictures "
                        "(DIR/index.html)")
    v = p.add_argument_group("predicted vs measured")
    v.add_argument("--validate", metavar="RUN_DIR", type=non_empty("--validate runs/first"),
                   help="compare a finished `shoal train --out RUN_DIR` run's measurement with the prediction it "
                        "stored; with --gpu/--hw-file/--hw (or a run that stored none) plan it now for that hardware "
                        "(default local) from its run.json, newest checkpoint or --recipe")
    v.add_argument("--recipe", metavar="TOML", type=non_empty("--recipe recipes/debug.toml"),
                   help="with --validate: the recipe the run was started with")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="with --validate --recipe: the run's --set overrides (repeatable)")
    p.set_defaults(func=run)
    p.set_defaults(plan_defaults=vars(p.parse_args([])))  # what "not given" looks like, for --validate's check


def _amount(text: str) -> float:
    suffixes = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * suffixes[t[-1]] if t and t[-1] in suffixes else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an amount: {text!r} (try 15e12 or 15T)") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite amount > 0, got {text!r} (try 15e12 or 15T)")
    return value


def _positive(name: str, value, allow_none: bool = True):
    if value is None and allow_none:
        return
    if value is None or value < 1:
        raise UserError(name, value, "must be a positive integer")


def build_model(args):
    from shoal.model.config import ModelConfig, get_preset

    if args.model:
        cfg = get_preset(args.model)
    elif None in (args.layers, args.hidden, args.heads):
        missing = [f"--{n}" for n, v in (("layers", args.layers), ("hidden", args.hidden), ("heads", args.heads)) if v is None]
        raise UserError("model", None, f"give --model PRESET, or the shape: {' '.join(missing)} missing")
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
    return "--" + SHAPE_FLAGS[field].replace("_", "-")


SHAPE_FLAGS = {"n_layers": "layers", "dim": "hidden", "n_heads": "heads", "n_kv_heads": "kv_heads",
               "ffn_hidden": "ffn_hidden", "vocab_size": "vocab", "mlp": "mlp", "n_experts": "experts", "top_k": "top_k",
               "expert_ffn_hidden": "expert_ffn_hidden", "n_shared_experts": "shared_experts"}
"""ModelConfig field -> the `shoal plan` flag (argparse's name) that sets it."""


def build(args):
    """Parsed flags -> (workload, cluster or None, fixed dims, model name)."""
    from shoal.planner import hardware, local_hardware
    from shoal.planner.layout import Cluster, Workload
    from shoal.planner.search import Fixed

    for name in ("seq_len", "global_batch"):
        if getattr(args, name) is None:
            raise UserError(name, None, f"give --{name.replace('_', '-')} N (or --validate RUN_DIR)")
    for name in ("seq_len", "global_batch", "gpus", "gpus_per_node", "tp", "pp", "dp", "ep", "micro_batch",
                 "pp_virtual_stages", "top"):
        _positive(name, getattr(args, name))
    cfg = build_model(args)
    if args.hw_file:
        gpu = hardware.load_hw_file(args.hw_file, args.gpu)
    elif args.gpu:
        gpu = hardware.get_gpu(args.gpu, remeasure=args.remeasure)
    else:
        raise UserError("gpu", None, f"name a device with --gpu ({', '.join(hardware.known_names())}) or --hw-file")
    if args.hw:
        gpu = hardware.apply_overrides(gpu, hardware.parse_hw_flags(args.hw))
    if args.gpus:  # `local`: the ranks share this machine's cores unless --gpus-per-node spreads them
        gpu = local_hardware.local_for_ranks(gpu, args.gpus_per_node or args.gpus)
    if args.gpus is None and not args.scale:
        raise UserError("gpus", None, "give the GPU count with --gpus N (or sweep with --scale A:B)")
    precision = args.precision or ("fp32" if local_hardware.is_local(gpu) else "bf16")
    if precision == "fp8" and not gpu.peak_fp8_flops:
        raise UserError("precision", "fp8", f"{gpu.name} has no FP8 tensor cores; use bf16, or give its FP8 peak "
                                            f"with --hw peak_fp8_flops=...")
    _slow_link_flags(args)
    workload = Workload(cfg, args.seq_len, args.global_batch, precision=precision, attention=args.attention,
                        grad_compression=args.grad_compression, topk_density=args.topk_density,
                        powersgd_rank=args.powersgd_rank, diloco_inner_steps=args.diloco_inner_steps,
                        diloco_quantize=args.diloco_quantize, diloco_overlap_steps=args.diloco_overlap_steps)
    per_node = args.gpus_per_node or gpu.gpus_per_node
    cluster = Cluster(gpu, args.gpus, per_node) if args.gpus else Cluster(gpu, 1, per_node)
    schedule = args.pp_schedule
    if schedule is None and args.pp_virtual_stages and args.pp_virtual_stages > 1:
        schedule = "interleaved-1f1b"  # asking for virtual stages means interleaving
    zero = 0 if args.diloco_inner_steps else args.zero  # DiLoCo plans replica groups of one rank
    fixed = Fixed(dp=args.dp, tp=args.tp, pp=args.pp, ep=args.ep, zero=zero, micro_batch=args.micro_batch,
                  activation_checkpoint=args.activation_checkpoint, pp_schedule=schedule,
                  pp_virtual_stages=args.pp_virtual_stages, sequence_parallel=args.sequence_parallel)
    if args.gpus:
        _check_pinned(fixed, args.gpus, workload)
    name = args.model or f"custom {cfg.n_layers}L/{cfg.dim}H/{cfg.n_heads}A"
    return workload, cluster, fixed, name


def _slow_link_flags(args) -> None:
    from shoal.layout import slow_link_setting_problems

    for problem in slow_link_setting_problems(args.topk_density, args.powersgd_rank, args.diloco_inner_steps,
                                              args.diloco_overlap_steps, name=lambda field: field.replace("_", "-")):
        raise problem
    if args.diloco_inner_steps and args.grad_compression != "none":
        raise UserError("grad-compression", args.grad_compression, "DiLoCo sends no gradients across replica groups; "
                        "use --diloco-quantize for its pseudo-gradient")
    if args.diloco_inner_steps and args.zero not in (None, 0):
        raise UserError("zero", args.zero, "the planner's DiLoCo makes each data-parallel rank its own replica "
                        "group, which replicates (zero=0); drop --zero")


def _check_pinned(fixed, n_gpus: int, workload) -> None:
    """The pinned dimensions alone must fit the model, the batch and the GPU count."""
    # The layout rules are shoal/layout.py's (the search applies them to whole layouts); the pinned
    # tp and pp alone are checked first so their own mistake is named before the GPU arithmetic.
    from shoal.layout import Layout, TrainerLimit, problems

    probe = Layout(tp=fixed.tp or 1, pp=fixed.pp or 1, zero=0, pp_schedule="gpipe")
    for p in problems(probe, workload.model, probe.world, workload.global_batch, workload.seq_len):
        if p.field in ("parallel.tp", "parallel.pp") and not isinstance(p, TrainerLimit):
            raise p
    pinned = {k: getattr(fixed, k) for k in ("dp", "tp", "pp") if getattr(fixed, k)}
    product = 1
    for v in pinned.values():
        product *= v
    expr = "*".join(f"{k}" for k in pinned) + " = " + "*".join(str(v) for v in pinned.values())
    if pinned and n_gpus % product:
        lower, upper = n_gpus // product * product, (n_gpus // product + 1) * product
        raise UserError("gpus", n_gpus, f"must be divisible by {expr}; try --gpus {lower or upper} or {upper}")
    if len(pinned) == 3 and product != n_gpus:
        raise UserError("gpus", n_gpus, f"{expr} = {product} ranks, not {n_gpus}; change --dp, --tp or --pp")


def _carbon_inputs(args, cluster):
    """Check --pue, --region and --carbon-trace before any work; the trace, if one is given."""
    from shoal.planner import energy

    args.pue = energy.DEFAULT_PUE if args.pue is None else energy.check_pue(args.pue)
    if args.region:
        energy.region_intensity(args.region)
    if args.region and args.carbon_trace:
        raise UserError("region", args.region, "give --region (an annual average) or --carbon-trace (hourly), not both")
    if (args.region or args.carbon_trace) and not args.tokens:
        raise UserError("tokens", None, "energy and CO2 are for a whole run: give its size with --tokens (e.g. 1T)")
    if (args.region or args.carbon_trace) and not cluster.gpu.board_watts:
        raise UserError("hw.power_watts", 0, f"{cluster.gpu.name} has no power figure; set one with --hw power_watts=700")
    return energy.read_trace(args.carbon_trace) if args.carbon_trace else None


VALIDATE_FLAGS = {"validate", "recipe", "overrides", "gpu", "gpus", "gpus_per_node", "hw", "hw_file", "remeasure",
                  "json"}
"""The flags --validate reads; any other flag shapes a new plan, and a run's comparison would drop it silently."""


def validate(args) -> int:
    from shoal.planner import hardware
    from shoal.planner.validate import compare

    defaults = getattr(args, "plan_defaults", {})
    for dest, default in defaults.items():
        if dest not in VALIDATE_FLAGS and dest != "plan_defaults" and getattr(args, dest, default) != default:
            flag = "--" + dest.replace("_", "-")
            raise UserError(flag, getattr(args, dest), "--validate compares a finished run with its prediction, so "
                            f"{flag} has no effect there; drop it, or plan anew without --validate")
    for name in ("gpus", "gpus_per_node"):  # 0 would read as "not given", the run's own
        _positive(name, getattr(args, name))
    gpu = None  # the prediction the run stored, unless other hardware is asked for
    if args.hw_file:
        gpu = hardware.load_hw_file(args.hw_file, args.gpu)
    elif args.gpu or args.hw or args.remeasure:
        gpu = hardware.get_gpu(args.gpu or "local", remeasure=args.remeasure)
    if args.hw:
        gpu = hardware.apply_overrides(gpu, hardware.parse_hw_flags(args.hw))
    c = compare(args.validate, gpu, recipe=args.recipe, overrides=args.overrides, gpus=args.gpus,
                gpus_per_node=args.gpus_per_node)
    if args.json:
        print(json.dumps({"validate": c.as_dict()}, indent=2))
        return 0
    mfu = f"{c.measured_mfu:.2%}" if c.measured_mfu is not None else "-"
    pred_mfu = f"{c.predicted_mfu:.2%}" if c.predicted_mfu is not None else "-"
    print(f"shoal plan --validate {c.run_dir}: {c.layout} on {c.world} x {c.hardware}, {c.steps_measured} steady steps")
    print(f"  prediction {c.source}")
    print(f"  {'':12} {'predicted':>10} {'measured':>10} {'ratio':>6}")
    print(f"  {'step (s)':12} {c.predicted_step_s:10.4g} {c.measured_step_s:10.4g} {c.step_ratio:6.2f}")
    print(f"  {'peak GiB':12} {c.predicted_peak_gib:10.3g} {c.measured_peak_gib:10.3g} {c.memory_ratio:6.2f}")
    print(f"  {'MFU':12} {pred_mfu:>10} {mfu:>10}   (against the run's own peak)")
    return 0


def run(args) -> int:
    from shoal.planner import cost, energy, scaling
    from shoal.layout import Layout
    from shoal.planner.render import plan_json
    from shoal.planner.recipe import EMITTED
    from shoal.planner.search import evaluate_pinned, search
    from shoal.report.html import OWN_FILES

    if args.validate:
        return validate(args)
    if args.recipe or args.overrides:
        raise UserError("recipe" if args.recipe else "set", args.recipe or args.overrides[0],
                        "--recipe and --set go with --validate RUN_DIR")
    for flag, folder in (("--figures", args.figures), ("--report", args.report)):
        if folder:  # outputs are checked before minutes of search, not after
            check_output_dir(flag, folder, own=OWN_FILES)  # an earlier plan's pictures are replaced, nothing else
    if args.emit:
        check_output_file("--emit", args.emit, replaces=EMITTED)  # never over a recipe a person wrote
    workload, cluster, fixed, name = build(args)
    if args.emit and workload.precision == "fp8":
        raise UserError("precision", "fp8", "shoal train has no FP8 yet, so there is no recipe to emit; "
                                            "plan with --precision bf16 to emit one")
    result = single = None
    if args.gpus:
        if fixed.complete and (fixed.ep or not workload.model.is_moe):
            layout = Layout(dp_shard=fixed.dp, tp=fixed.tp, pp=fixed.pp, ep=fixed.ep or 1, zero=fixed.zero,
                            micro_batch=fixed.micro_batch, pp_schedule=fixed.pp_schedule or "1f1b",
                            pp_virtual_stages=fixed.pp_virtual_stages or 1,
                            activation_checkpoint=fixed.activation_checkpoint,
                            sequence_parallel=fixed.tp > 1 if fixed.sequence_parallel is None else fixed.sequence_parallel)
            single = evaluate_pinned(workload, layout, cluster, interleave_given=fixed.pp_virtual_stages is not None)
        else:
            result = search(workload, cluster, fixed, rank_by=args.rank_by, keep=max(args.top, 10))
    best = single or (result.best if result else None)

    # No price given: the catalog's on-demand list price for the device (hardware.py), if it has one.
    price = args.usd_per_gpu_hour if args.usd_per_gpu_hour is not None else (cluster.gpu.usd_per_gpu_hour or None)
    trace = _carbon_inputs(args, cluster)

    def budget(plan):
        """(time-to-train and cost, energy and CO2) of one plan (with --tokens)."""
        est = cost.estimate(
            args.tokens, plan.tokens_per_s, cluster.n_gpus, usd_per_gpu_hour=price,
            mtbf_gpu_hours=cost.DEFAULT_MTBF_GPU_HOURS if args.mtbf_hours is None else args.mtbf_hours,
            checkpoint_interval_hours=args.checkpoint_every_min / 60, restart_hours=args.restart_min / 60,
            checkpoint_write_hours=args.checkpoint_write_min / 60)
        return est, energy.run_energy(est, cluster, pue=args.pue, region=args.region, trace=trace)

    training, used = budget(best) if args.tokens and best and best.fits else (None, None)
    window = energy.best_start(trace, used.hours) if trace is not None and used is not None else None

    points = None
    if args.scale:
        a, b = scaling.parse_scale(args.scale)
        points = scaling.sweep(workload, cluster, scaling.gpu_counts(a, b), fixed, base_gpus=args.gpus or a,
                               rank_by=args.rank_by)

    emitted = None
    if args.emit:
        from shoal.planner.recipe import write_recipe

        if not best or not best.fits:
            print("shoal plan: nothing to emit: no layout fits in memory", file=sys.stderr)
            return 1
        emitted = write_recipe(args.emit, best, preset=args.model if args.model else None, tokens=args.tokens)

    figures = []
    if args.figures:
        from pathlib import Path

        from shoal.report import plan_figures

        out = Path(args.figures)
        shown = [best] if single else (result.plans[: args.top] if result else [])
        if shown:
            figures += plan_figures.memory_figure(shown, out / "plan_memory")
            figures += plan_figures.time_figure(shown, out / "plan_time")
        if points:
            figures += plan_figures.scaling_figure(points, out / "plan_scaling")

    if args.report:
        from shoal.report.plan_report import write_plan_report

        figures.append(write_plan_report(args.report, best, cluster, name, points))

    if args.json:
        doc = plan_json(workload, cluster, name, result=result, single=single, top=args.top, training=training,
                        scale=points, usd_per_gpu_hour=price, budget=budget if args.tokens else None,
                        carbon_window=window)
        doc["emitted"] = str(emitted) if emitted else None
        doc["figures"] = [str(f) for f in figures]
        print(json.dumps(doc, indent=2))
        return 0
    _print_text(workload, cluster, name, result, single, training, points, emitted, figures, args.top, price,
                used, window)
    return 0


def _print_text(workload, cluster, name, result, single, training, points, emitted, figures, top, usd,
                used=None, window=None) -> None:
    from rich.console import Console

    from shoal.planner.hardware import GiB
    from shoal.planner.render import (breakdown_lines, energy_lines, headline, layouts_table, scale_table,
                                      training_lines)

    con = Console()
    if not con.is_terminal:
        con = Console(width=160)  # piped or captured: don't squeeze the tables into 80 columns
    if single or result:
        con.print(f"[bold]shoal plan[/]: {headline(workload, cluster, name)}")
    else:
        con.print(f"[bold]shoal plan[/]: {name} on {cluster.gpu.name}, seq {workload.seq_len}, batch {workload.global_batch}")
    best = single or (result.best if result else None)
    if single:
        verdict = "fits" if single.fits else "does NOT fit"
        con.print(f"one layout, evaluated: {single.layout.short()} — {verdict}: {'; '.join(single.reasons)}")
    if result:
        rej = result.rejected
        parts = [f"{result.fitting} fit"]
        if result.dominated:
            parts.append(f"{result.dominated} skipped (fit with less recompute)")
        if rej.get("memory"):
            parts.append(f"{rej['memory']} need more than {cluster.gpu.hbm_bytes / GiB:.0f} GiB")
        if rej.get("trainer"):
            parts.append(f"{rej['trainer']} not runnable by shoal train yet")
        other = sum(v for k, v in rej.items() if k not in ("memory", "trainer"))
        if other:
            parts.append(f"{other} do not divide ({', '.join(sorted(k for k in rej if k not in ('memory', 'trainer')))})")
        con.print(f"searched {result.evaluated} layouts in {result.seconds:.2f} s: " + ", ".join(parts))
        if result.note:
            con.print(f"[bold yellow]note[/]: {result.note}")
        if result.plans:
            con.print(layouts_table(result.plans[:top], "best layouts (ranked by tokens/s)"))
        if result.closest_misses and (not result.plans or len(result.plans) < top):
            con.print(layouts_table(result.closest_misses, "closest layouts that do not fit"))
        if not result.plans:
            con.print("[bold red]no layout fits in memory[/]: add GPUs, use a larger device, or shorten the sequence")
    if best:
        con.print(f"[bold]{'this layout' if single else 'best'}[/]: {best.layout.short()}")
        for line in breakdown_lines(best):
            con.print("  " + line)
    if training:
        for line in training_lines(training) + energy_lines(used, window):
            con.print(line)
    if points:
        con.print(scale_table(points, usd))
    if emitted:
        con.print(f"recipe written to {emitted} (run it with: shoal train {emitted})")
    for f in figures:
        con.print(f"figure: {f}")
