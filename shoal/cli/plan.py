"""`shoal plan`: predict memory, step time, MFU, time-to-train and cost; search layouts; scaling curve.

Parsing and rendering only; the planner lives in shoal/planner. Never imports torch.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from shoal import hardware
from shoal.cli.argtypes import (PRECISION_ALIASES, SCHEDULE_ALIASES, int_at_least, mlp_kind, non_empty,
                                nonnegative_float, one_of, positive_float)
from shoal.files import check_output_dir, check_output_file
from shoal.errors import UserError
from shoal.layout import ACTIVATION_CHECKPOINT, DILOCO_QUANTIZE, GRAD_COMPRESSION, OFFLOAD, SCHEDULES
from shoal.model.hf_shape import SHAPE_NOTE
from shoal.planner.scaling import MAX_SPAN
from shoal.planner.stacks import DEFAULT_STACK_NOTE, STACKS
from shoal.planner.workload import (ADAM_MOMENTS, ATTENTION, FP8_GATHERS, FP8_SAVES, GRAD_ACCUMULATION, GRAD_REDUCES,
                                    KERNELS, LOSSES, MOE_DISPATCH, MOE_PROBS, PP_P2P, PRECISIONS, WEIGHT_GATHERS,
                                    ZERO3_IMPLS, CP_COMMS, EP_OVERLAPS)

EPILOG = """examples:
  shoal plan --model llama3-8b --seq-len 8192 --global-batch 512 --gpu h100 --gpus 64
  shoal plan --model llama3-405b --seq-len 8192 --global-batch 2048 --gpu h100 --gpus 16384 --tokens 15e12 \\
             --usd-per-gpu-hour 2
  shoal plan --model llama3-70b --seq-len 4096 --global-batch 1024 --gpu h100 --gpus 512 --tp 8 --pp 4 --dp 16 \\
             --zero 1 --micro-batch 1 --activation-checkpoint selective --emit recipes/plan-70b.toml
  shoal plan --model llama3-70b --seq-len 4096 --global-batch 1024 --gpu h100 --scale 8:16384 --figures runs/plan
"""


def register(sub) -> None:
    p = sub.add_parser("plan", help="predict memory/time/MFU/cost of parallel layouts and search them",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    for add in (_model_flags, _workload_flags, _stack_flags, _layout_flags, _slow_link_flags, _budget_flags,
                _validate_flags):
        add(p)
    p.set_defaults(func=run)
    p.set_defaults(plan_defaults=vars(p.parse_args([])))  # what "not given" looks like, for --validate's check


def _model_flags(p) -> None:
    m = p.add_argument_group("model (a preset, or the shape)")
    m.add_argument("--model", metavar="PRESET", help="a preset from `shoal presets`, or a model folder (a Hugging Face "
                                                     "config.json, a shoal model/); shape flags override its fields")
    m.add_argument("--layers", type=int)
    m.add_argument("--hidden", type=int)
    m.add_argument("--heads", type=int)
    m.add_argument("--kv-heads", type=int, help="default: --heads (multi-head attention)")
    m.add_argument("--head-dim", type=int, help="width of one head where it is not hidden/heads (Qwen3, Gemma)")
    m.add_argument("--qk-norm", action="store_true", default=None, help="RMSNorm on each head's q and k (Qwen3)")
    m.add_argument("--ffn-hidden", type=int, help="default: 4H for gelu, ~8H/3 rounded to 256 for swiglu")
    m.add_argument("--vocab", type=int, help="default 32000")
    m.add_argument("--mlp", type=mlp_kind, metavar="{swiglu,gelu}",
                   help="swiglu: a gated MLP of three matrices (SwiGLU, GeGLU); gelu: two matrices (GELU, ReLU, "
                        "squared ReLU as Nemotron's), which `relu` and `relu2` are also read as")
    m.add_argument("--experts", type=int)
    m.add_argument("--top-k", type=int)
    m.add_argument("--expert-ffn-hidden", type=int)
    m.add_argument("--shared-experts", type=int)


def _workload_flags(p) -> None:
    w = p.add_argument_group("workload and cluster")
    w.add_argument("--seq-len", type=int, help="tokens per sequence (required unless --validate)")
    w.add_argument("--global-batch", type=int, help="sequences per optimizer step (required unless --validate)")
    w.add_argument("--gpu", metavar="NAME", help=f"{', '.join(hardware.known_names())} (aliases and the names "
                                                  "torch and nvidia-smi print are accepted)")
    w.add_argument("--gpus", type=int, help="GPU count (optional with --scale)")
    w.add_argument("--gpus-per-node", type=int)
    w.add_argument("--precision", type=one_of(PRECISIONS, PRECISION_ALIASES, "a precision"),
                   metavar="{" + ",".join(PRECISIONS) + "}",
                   help="default bf16 (mixed precision); fp32 with --gpu local, as CPUs train in fp32; fp8: GEMMs "
                        "in FP8 (Transformer Engine), the rest as bf16; fp16: as bf16 plus a loss scaler; MFU stays "
                        "against the BF16 peak")
    w.add_argument("--kernels", choices=KERNELS,
                   help="fused (default on GPUs: norms and activations as fused kernels, as Megatron/TE, "
                        "torch.compile and XLA run them; an emitted recipe sets train.compile) or eager (one PyTorch "
                        "op per kernel: shoal train without train.compile; the default with --gpu local)")
    w.add_argument("--document-mask", action="store_true",
                   help="packed documents attend only within themselves (data.document_mask): an explicit mask "
                        "per layer, and attention without the causal skip")
    w.add_argument("--hw", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a hardware field, e.g. --hw inter_node_bandwidth=25e9 (repeatable)")
    w.add_argument("--hw-file", metavar="TOML", type=non_empty("--hw-file hw.toml"),
                   help="hardware fields in TOML (base = \"h100-sxm\" + overrides)")
    w.add_argument("--remeasure", action="store_true", help="with --gpu local: measure this machine again")


def _stack_flags(p) -> None:
    w = p.add_argument_group("software stack (how the run's software runs the layer; --stack sets the ones not given)")
    w.add_argument("--stack", choices=tuple(STACKS),
                   help="the software the run trains on, which sets the stack settings below that are not given "
                        "(docs/planner.md, shoal/planner/stacks.py): shoal (shoal train: the default with --emit or "
                        "--gpu local), megatron-bridge, torchtitan (the default for a GPU layout pinned to --zero 3: a "
                        "PyTorch FSDP program), megatron-lm-2021, megatron-deepspeed; otherwise each setting takes "
                        "its own default")
    w.add_argument("--attention", choices=ATTENTION,
                   help="flash: the device's own fused kernel (cuDNN on Hopper+, as shoal and Transformer Engine "
                        "run it; default); flash2: FlashAttention-2, PyTorch SDPA's default backend; unfused: S×S "
                        "scores in memory, as Megatron-LM before flash attention")
    w.add_argument("--fp8-saves", choices=FP8_SAVES,
                   help="with --precision fp8, what a GEMM keeps of its input for backward: fp8 (its 1-byte cast, as "
                        "Transformer Engine and DeepSeek-V3; default) or input (the 16-bit input, as torchao's "
                        "Float8Linear and shoal train: the default with --emit or --gpu local)")
    w.add_argument("--weight-gather", choices=WEIGHT_GATHERS,
                   help="the dtype sharded weights are gathered in (ZeRO-3, ZeRO-1/2's re-gather): bf16 (default: "
                        "torchtitan, Megatron-Core, DeepSpeed) or fp32 (shoal train under bf16/fp8/fp16, whose FSDP2 "
                        "gathers the fp32 weights: the default with --emit or --gpu local)")
    w.add_argument("--moe-dispatch", choices=MOE_DISPATCH,
                   help="dedup (default on GPUs): a token goes once to each rank holding its experts, in FP8 under "
                        "fp8 (DeepSeek-V3's DeepEP); dedup-bf16: in 16 bits (Megatron-Core's flex dispatcher); per-expert "
                        "(the default with --emit or --gpu local): a copy per chosen expert in the activations' "
                        "precision (Megatron-Core's alltoall dispatcher, shoal train)")
    w.add_argument("--moe-probs", choices=MOE_PROBS,
                   help="where an MoE layer weighs each expert's output by its router probability: activation "
                        "(default on GPUs: inside the expert's SwiGLU, as Megatron-Core; its combine keeps nothing) "
                        "or output (the default with --emit or --gpu local: after the expert, as shoal train, which "
                        "keeps the expert outputs for backward)")
    w.add_argument("--loss", choices=LOSSES,
                   help="with fused kernels, what the cross-entropy keeps per logit: fp32 (its fp32 logits and their "
                        "gradient, 8 bytes; default), te (Transformer Engine's, the gradient over the 16-bit logits, "
                        "2 bytes) or megatron (Megatron-Core's own fused loss, 6 bytes); on a TPU, whatever this says, "
                        "the XLA program keeps the fp32 logits only, 4 bytes")
    w.add_argument("--adam-moments", choices=ADAM_MOMENTS,
                   help="the dtype of Adam's two moments: fp32 (default) or bf16 (DeepSeek-V3; Megatron-Core's "
                        "precision-aware optimizer with exp_avg_dtype bf16), 4 bytes less per parameter")
    w.add_argument("--grad-overlap", choices=("on", "off"),
                   help="on (default): the gradient reduction runs beside the backward and the parameter gather beside "
                        "the next forward (DDP, FSDP, Megatron-Core --overlap-grad-reduce); off: both after the last "
                        "backward, as Megatron-LM until 2023 and DeepSpeed's pipeline engine ran them")
    w.add_argument("--grad-accumulation", choices=GRAD_ACCUMULATION,
                   help="fused (default on GPUs): each micro-batch's weight gradient is accumulated inside its GEMM "
                        "(Megatron-Core, Transformer Engine); separate (the default with --emit or --gpu local): a "
                        "pass over the GPU's gradients per micro-batch adds it, as PyTorch autograd (shoal train, "
                        "DeepSpeed's pipeline engine) and Megatron-LM's 2021 DDP do")
    w.add_argument("--grad-reduce", choices=GRAD_REDUCES,
                   help="the dtype gradients are reduced in across data-parallel ranks: auto (default: fp32, 16 bits "
                        "under --precision fp16, as Megatron and DeepSpeed reduce fp16 gradients), fp32 (shoal, "
                        "torchtitan, Megatron under bf16) or bf16 (Megatron-Bridge's performance recipes)")
    w.add_argument("--fp8-gather", choices=FP8_GATHERS,
                   help="with --precision fp8, which all-gathers move FP8: activations (default: the "
                        "sequence-parallel gathers of the GEMM inputs, as Transformer Engine and torchao cast "
                        "before gathering), none (every gather 16-bit, as shoal train: the default with --emit or "
                        "--gpu local) or all (also the ZeRO weight gathers: Megatron-Core's fp8_param_gather)")
    w.add_argument("--pp-p2p", choices=PP_P2P,
                   help="batched (default): a pipeline stage posts a step's send and receive together (shoal train, "
                        "Megatron-LM); blocking: each send and receive on its own, four per micro-batch, the 1/tp "
                        "slices re-gathered over TP, as DeepSpeed's pipeline engine runs them")
    w.add_argument("--pp-overlap", choices=("on", "off"),
                   help="on: an interleaved pipeline's sends and receives run beside the chunk computed meanwhile "
                        "(Megatron's overlap_p2p_comm); off (default): on the critical path, as shoal train runs them")
    w.add_argument("--ep-overlap", choices=EP_OVERLAPS, help="the expert all-to-all beside another micro-batch: on "
                   "(Megatron's --overlap-moe-expert-parallel-comm), off (its default, shoal train), auto (default: across nodes)")
    w.add_argument("--offload-overlap", choices=("on", "off"),
                   help="with --activation-offload: on (default) the copies to and from the host run on their own "
                        "stream beside the next layer (Transformer Engine's CPU offload, Megatron-Core's "
                        "cpu_offloading); off: on the compute stream, the next kernel waiting (save_on_cpu, shoal "
                        "train)")
    w.add_argument("--zero3-impl", choices=ZERO3_IMPLS,
                   help="how ZeRO-3 gathers and reduces: fsdp (default: a layer at a time, the next prefetched, fp32 "
                        "reduce-scatter; FSDP2, shoal train) or deepspeed-2021 (DeepSpeed v0.3.13: one all_gather per "
                        "weight, one module ahead, host and device in step, fp16 all-reduce of gradient buckets)")
    w.add_argument("--cp-comm", choices=CP_COMMS,
                   help="how context parallelism moves K/V: p2p (default: Transformer Engine's ring, each step beside "
                        "its attention), all-gather (shoal train: gathered before attention, dK/dV reduce-scattered, "
                        "not overlapped), torch-ring (PyTorch's context_parallel as torchtitan ran it: one gather "
                        "beside the first attention call, fp32 merges, fp32 dK/dV ring) or a2a (Ulysses, Megatron's "
                        "cp_comm_type a2a: Q, K, V and the output all-to-all'ed between sequence and heads)")


def _layout_flags(p) -> None:
    lay = p.add_argument_group("layout (a flag fixes that dimension; the rest are searched)")
    lay.add_argument("--tp", type=int)
    lay.add_argument("--pp", type=int)
    lay.add_argument("--cp", type=int, help="context parallelism (parallel.cp): each sequence split over cp ranks")
    lay.add_argument("--dp", type=int, help="the whole data-parallel degree (with --dp-replicate, all replica groups)")
    lay.add_argument("--dp-replicate", type=int,
                     help="HSDP (parallel.dp_replicate): the data-parallel ranks form this many replica groups; ZeRO "
                          "shards within each group of dp/dp-replicate ranks and the groups all-reduce the reduced "
                          "gradient shards (torchtitan's data_parallel_replicate_degree, FSDP's HYBRID_SHARD); "
                          "default 1 with --dp given, else searched")
    lay.add_argument("--ep", type=int)
    lay.add_argument("--etp", "--expert-tp", dest="expert_tp", type=int,
                     help="expert tensor parallelism (parallel.expert_tp, Megatron's ETP): each routed expert split "
                          "this many ways, the expert grid re-partitioning the tp x cp x dp ranks (MoE parallel "
                          "folding); default: tp where ep fits inside dp, 1 where it folds over tp")
    lay.add_argument("--zero", type=int, choices=(0, 1, 2, 3))
    lay.add_argument("--micro-batch", type=int)
    lay.add_argument("--activation-checkpoint", "--recompute", dest="activation_checkpoint",
                     choices=ACTIVATION_CHECKPOINT, help="train.activation_checkpoint (--recompute is an alias)")
    lay.add_argument("--pp-schedule", type=one_of(SCHEDULES, SCHEDULE_ALIASES, "a pipeline schedule"),
                     metavar="{" + ",".join(SCHEDULES) + "}")
    lay.add_argument("--pp-virtual-stages", "--pp-virtual", dest="pp_virtual_stages", type=int,
                     help="stages per pipeline rank (interleaved schedules)")
    lay.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    lay.add_argument("--offload", choices=OFFLOAD, help="parallel.offload: optimizer state (and with params the "
                     "weights) in host memory (default none)")
    lay.add_argument("--activation-offload", action=argparse.BooleanOptionalAction, default=None,
                     help="train.activation_offload: saved activations in host memory between forward and backward")


def _slow_link_flags(p) -> None:
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


MAX_TOP = 100
"""The most layouts --top shows: the search times that many in full, and a 64-GPU plan has thousands that fit,
so `--top 99999999999999999999` printed 9,000 lines in 12 s instead of 14 in 1. A table past a few screens is
not read; a layout further down is seen by pinning its dimensions (--tp, --pp, ...)."""


def _budget_flags(p) -> None:
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
    o.add_argument("--top", type=int_at_least(1, "layouts ranked and shown", most=MAX_TOP), default=10,
                   help=f"how many of the best layouts to show (default 10, at most {MAX_TOP})")
    o.add_argument("--json", action="store_true", help="print JSON instead of tables")
    o.add_argument("--emit", metavar="FILE", type=non_empty("--emit recipes/plan.toml"),
                   help="write the best layout as a `shoal train` recipe (TOML)")
    o.add_argument("--scale", metavar="A:B", help="sweep GPU counts A, 2A, ... B at fixed global and per-GPU batch "
                                                  f"(B/A at most {MAX_SPAN:,})")
    o.add_argument("--figures", metavar="DIR", type=non_empty("--figures runs/plan"),
                   help="save memory/time/scaling pictures (PNG and SVG) here")
    o.add_argument("--report", metavar="DIR", type=non_empty("--report runs/plan-report"),
                   help="write a page with the best layout's rank grid, memory, step time and scaling pictures "
                        "(DIR/index.html)")


def _validate_flags(p) -> None:
    v = p.add_argument_group("predicted vs measured")
    v.add_argument("--validate", metavar="RUN_DIR", type=non_empty("--validate runs/first"),
                   help="compare a finished `shoal train --out RUN_DIR` run's measurement with the prediction it "
                        "stored; with --gpu/--hw-file/--hw (or a run that stored none) plan it now for that hardware "
                        "(default local) from its run.json, newest checkpoint or --recipe")
    v.add_argument("--recipe", metavar="TOML", type=non_empty("--recipe recipes/debug.toml"),
                   help="with --validate: the recipe the run was started with")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="with --validate --recipe: the run's --set overrides (repeatable)")


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


def validate(args) -> int:
    from shoal.cli.console import print_json
    from shoal.planner.request import validate_hardware
    from shoal.planner.validate import compare

    gpu = validate_hardware(args, getattr(args, "plan_defaults", {}))
    c = compare(args.validate, gpu, recipe=args.recipe, overrides=args.overrides, gpus=args.gpus,
                gpus_per_node=args.gpus_per_node)
    if args.json:
        print_json({"validate": c.as_dict()})
        return 0
    mfu = f"{c.measured_mfu:.2%}" if c.measured_mfu is not None else "-"
    pred_mfu = f"{c.predicted_mfu:.2%}" if c.predicted_mfu is not None else "-"
    print(f"shoal plan --validate {c.run_dir}: {c.layout} on {c.world} x {c.hardware}, {c.steps_measured} steady steps")
    print(f"  prediction {c.source}")
    print(f"  {'':12} {'predicted':>10} {'measured':>10} {'ratio':>6}")
    print(f"  {'step (s)':12} {c.predicted_step_s:10.4g} {c.measured_step_s:10.4g} {c.step_ratio:6.2f}")
    print(f"  {'peak GiB':12} {c.predicted_peak_gib:10.3g} {c.measured_peak_gib:10.3g} {c.memory_ratio:6.2f}")
    print(f"  {'MFU':12} {pred_mfu:>10} {mfu:>10}   (against the run's own peak, medians of the steady steps)")
    return 0


CONFIG_FLAGS = {
    "train.global_batch": "--global-batch", "train.micro_batch": "--micro-batch", "train.seq_len": "--seq-len",
    "train.activation_checkpoint": "--activation-checkpoint", "train.precision": "--precision",
    "train.activation_offload": "--activation-offload", "parallel.dp_shard": "--dp",
    "parallel.dp_replicate": "--dp-replicate", "parallel.tp": "--tp", "parallel.cp": "--cp", "parallel.pp": "--pp",
    "parallel.ep": "--ep", "parallel.expert_tp": "--etp", "parallel.zero": "--zero", "parallel.pp_schedule": "--pp-schedule",
    "parallel.pp_virtual_stages": "--pp-virtual-stages", "parallel.offload": "--offload",
    "parallel.grad_compression": "--grad-compression", "parallel.diloco_inner_steps": "--diloco-inner-steps",
    "parallel.sequence_parallel": "--sequence-parallel"}
"""The layout rules speak the job config's names (shoal/layout_rules.py, one home for them); a plan is asked for with
flags, so its refusals say the flag that was typed."""


def in_flags(e: UserError) -> UserError:
    """`e` with the config names it mentions as the plan's flags ("try --global-batch 64 or 128")."""
    def flag(text: str) -> str:
        for name, option in CONFIG_FLAGS.items():
            text = re.sub(rf"\b{re.escape(name)}=", f"{option} ", text)
            text = re.sub(rf"\b{re.escape(name)}\b", option, text)
        return text
    return type(e)(CONFIG_FLAGS.get(e.field, e.field), e.value, flag(e.fix))


def run(args) -> int:
    from shoal.cli.console import print_json
    from shoal.planner.recipe import EMITTED
    from shoal.planner.render import plan_json
    from shoal.planner.request import answer, build, ignored_flags
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
    try:
        inputs = build(args)
        ans = answer(args, inputs)
    except UserError as e:
        raise in_flags(e) from None
    for line in ignored_flags(args):  # after every refusal: a refused plan's one line stays one line
        print(f"shoal plan: warning: {line}", file=sys.stderr)
    emitted = None
    if args.emit:
        from shoal.planner.recipe import write_recipe

        if not ans.best or not ans.best.fits:
            print("shoal plan: nothing to emit: no layout fits in memory", file=sys.stderr)
            return 1
        emitted = write_recipe(args.emit, ans.best, preset=args.model if args.model else None, tokens=args.tokens)
    figures = _figures(args, ans)
    if args.json:
        doc = plan_json(inputs.workload, inputs.cluster, inputs.name, result=ans.result, single=ans.single,
                        top=args.top, training=ans.training, scale=ans.points, usd_per_gpu_hour=ans.price,
                        budget=ans.budget, carbon_window=ans.window)
        print_json({**doc, "emitted": str(emitted) if emitted else None, "figures": [str(f) for f in figures]})
        return 0
    _print_text(ans, emitted, figures, args.top, stack_given=bool(args.stack))
    return 0


def _figures(args, ans) -> list:
    """--figures: memory, step time and scaling pictures; --report: the page with the best layout's."""
    from pathlib import Path

    figures = []
    if args.figures:
        from shoal.report import plan_figures

        out = Path(args.figures)
        shown = [ans.best] if ans.single else (ans.result.plans[: args.top] if ans.result else [])
        if shown:
            figures += plan_figures.memory_figure(shown, out / "plan_memory")
            figures += plan_figures.time_figure(shown, out / "plan_time")
        if ans.points:
            figures += plan_figures.scaling_figure(ans.points, out / "plan_scaling")
    if args.report:
        from shoal.report.plan_report import write_plan_report

        figures.append(write_plan_report(args.report, ans.best, ans.inputs.cluster, ans.inputs.name, ans.points))
    return figures


def _print_text(ans, emitted, figures, top: int, stack_given: bool) -> None:
    from rich.console import Console

    from shoal.hardware.gpu import GiB
    from shoal.planner.render import (breakdown_lines, energy_lines, headline, layouts_table, scale_table,
                                      training_lines)

    workload, cluster, name = ans.inputs.workload, ans.inputs.cluster, ans.inputs.name
    result, single, best = ans.result, ans.single, ans.best
    con = Console()
    if not con.is_terminal:
        con = Console(width=160)  # piped or captured: don't squeeze the tables into 80 columns
    if single or result:
        con.print(f"[bold]shoal plan[/]: {headline(workload, cluster, name)}")
        if workload.model.note.startswith(SHAPE_NOTE):  # a model folder of a family shoal train does not compute
            con.print(f"[bold yellow]note[/]: {workload.model.note}")
        if workload.stack not in (None, "shoal") and not stack_given:  # stacks.default_stack chose it
            con.print(f"[bold yellow]note[/]: {DEFAULT_STACK_NOTE}")
    else:
        con.print(f"[bold]shoal plan[/]: {name} on {cluster.gpu.name}, seq {workload.seq_len}, "
                  f"batch {workload.global_batch}")
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
            fields = ", ".join(sorted(k for k in rej if k not in ("memory", "trainer")))
            parts.append(f"{other} do not divide ({fields})")
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
    if ans.training:
        for line in training_lines(ans.training) + energy_lines(ans.used, ans.window):
            con.print(line)
    if ans.points:
        con.print(scale_table(ans.points, ans.price))
    if emitted:
        con.print(f"recipe written to {emitted} (run it with: shoal train {emitted})")
    for f in figures:
        con.print(f"figure: {f}")
