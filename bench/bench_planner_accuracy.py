"""How close is the planner to published runs it was not calibrated on? Prints, never asserts.

    PYTHONPATH=. .venv/bin/python bench/bench_planner_accuracy.py            # every run
    PYTHONPATH=. .venv/bin/python bench/bench_planner_accuracy.py --heldout  # only the held-out ones
    PYTHONPATH=. .venv/bin/python bench/bench_planner_accuracy.py --defaults # no row's stack or stack settings

Each run of bench/published_runs.toml goes through the planner with its published layout pinned
(the same evaluate_pinned() that `shoal plan` calls when every dimension is given; where the source
does not publish the micro-batch or the recompute, the same search `shoal plan` runs over them). The compared number
is tokens/s per GPU, so the relative error is the MFU error whatever FLOP formula the source used.
Prints per-run and per-family error and the mean absolute error, all runs and held-out apart, and each
issue's added runs (their `part`) apart. With --defaults every row plans with its stack and stack settings left
out, as `shoal plan --json` does when it is given the published layout and nothing about the software.
"""

from __future__ import annotations

import statistics
import sys
import tomllib
from pathlib import Path

from shoal.model import analytics
from shoal.model.config import PRESETS, ModelConfig
from shoal import hardware
from shoal.planner.search import Fixed, evaluate_pinned, search
from shoal.planner.stacks import STACK_SETTINGS, default_stack, stack_settings
from shoal.layout import Layout
from shoal.planner.workload import Cluster, Workload

DATA = Path(__file__).with_name("published_runs.toml")


def model(name: str, shapes: dict, seq: int) -> ModelConfig:
    if name in PRESETS:
        return PRESETS[name]
    s = shapes[name]
    moe = dict(n_experts=s["experts"], top_k=s["top_k"], expert_ffn_hidden=s["expert_ffn"]) if "experts" in s else {}
    return ModelConfig(vocab_size=s["vocab"], dim=s["hidden"], n_layers=s["layers"], n_heads=s["heads"],
                       n_kv_heads=s.get("kv_heads", s["heads"]), head_dim=s.get("head_dim", 0),
                       qk_norm=s.get("qk_norm", False), qkv_bias=s.get("qkv_bias", False), ffn_hidden=s["ffn"],
                       mlp=s["mlp"], max_seq_len=max(seq, 2048), **moe).validate()


def published_tokens_per_gpu_s(run: dict, cfg: ModelConfig) -> float:
    if "tokens_per_gpu_s" in run:
        return float(run["tokens_per_gpu_s"])
    if run["metric"] == "model_tflops":  # DESIGN.md's model FLOPs per token (6N + 12LHS, PaLM's convention)
        return run["tflops_per_gpu"] * 1e12 / analytics.flops_per_token(cfg, run["seq"])
    B, s = run["global_batch"], run["seq"]
    if run["metric"] == "megatron_model":  # Megatron-LM's num_floating_point_operations = Korthikanti Eq. 7
        flops = analytics.korthikanti_model_flops_per_iteration(B, s, cfg.n_layers, cfg.dim, cfg.vocab_size)
    else:
        assert run["metric"] == "megatron_eq3", run["id"]
        flops = analytics.megatron_flops_per_iteration(B, s, cfg.n_layers, cfg.dim, cfg.vocab_size)
    step = flops / (run["tflops_per_gpu"] * 1e12 * run["gpus"])
    return B * s / step / run["gpus"]


def predict(run: dict, cfg: ModelConfig):
    gpu, lay = hardware.get_gpu(run["gpu"]), run["layout"]
    if run.get("hw"):
        gpu = hardware.apply_overrides(gpu, run["hw"])
    # The row's stack (stacks.py; without one, the stack its layout implies, as `shoal plan` takes it), then the
    # settings the row gives itself; the rest are the Workload's defaults.
    stack = run.get("stack") or default_stack(bool(gpu.xla_step), lay.get("zero"))
    settings = stack_settings(stack, {name: run.get(name) for name in STACK_SETTINGS})
    wl = Workload(cfg, run["seq"], run["global_batch"], precision=run.get("precision", "bf16"), **settings)
    cluster = Cluster(gpu, run["gpus"], gpu.gpus_per_node)
    if "micro_batch" not in lay or "recompute" not in lay:
        # The source leaves them out: search them, as `shoal plan` does with only these dimensions pinned.
        fixed = Fixed(dp=lay["dp"], dp_replicate=1, tp=lay["tp"], pp=lay["pp"], ep=lay.get("ep", 1),
                      expert_tp=lay.get("etp"),
                      cp=lay.get("cp", 1), zero=lay.get("zero"), sequence_parallel=lay.get("sp"), micro_batch=lay.get("micro_batch"),
                      pp_schedule=lay.get("schedule"), pp_virtual_stages=lay.get("virtual"),
                      activation_offload=lay.get("activation_offload"))
        return search(wl, cluster, fixed).best
    layout = Layout(dp_shard=lay["dp"], tp=lay["tp"], pp=lay["pp"], ep=lay.get("ep", 1), cp=lay.get("cp", 1),
                    expert_tp=lay.get("etp", 0),
                    zero=lay["zero"], micro_batch=lay["micro_batch"],
                    activation_checkpoint=lay["recompute"], pp_schedule=lay.get("schedule", "1f1b"),
                    pp_virtual_stages=lay.get("virtual", 1), sequence_parallel=lay.get("sp", False),
                    activation_offload=lay.get("activation_offload", False))
    # The same call as `shoal plan` with every dimension pinned (an unpublished interleaving factor is searched).
    return evaluate_pinned(wl, layout, cluster, interleave_given="virtual" in lay)


def main(argv: list[str]) -> int:
    data = tomllib.loads(DATA.read_text())
    runs = [r for r in data["run"] if r.get("heldout") or "--heldout" not in argv]
    if "--defaults" in argv:
        runs = [{k: v for k, v in r.items() if k != "stack" and k not in STACK_SETTINGS} for r in runs]
    rows = []
    print(f"{'run':30} {'family':24} {'pub tok/s/GPU':>13} {'pred':>9} {'pub MFU':>8} {'pred MFU':>8} {'error':>7}  fits")
    for run in runs:
        cfg = model(run["model"], data["models"], run["seq"])
        plan = predict(run, cfg)
        pub = published_tokens_per_gpu_s(run, cfg)
        pred = plan.tokens_per_s / run["gpus"]
        peak = plan.cluster.gpu.peak_flops("bf16")
        fpt = analytics.flops_per_token(cfg, run["seq"])
        err = pred / pub - 1
        rows.append((run, err))
        mark = "*" if run.get("heldout") else " "
        print(f"{run['id'] + mark:30} {run['family']:24} {pub:13.0f} {pred:9.0f} {pub * fpt / peak:8.1%} "
              f"{plan.mfu:8.1%} {err:+7.1%}  {'yes' if plan.fits else 'NO'}")
    print("\n(* held out: never tuned against. MFU in DESIGN.md's convention for both columns.)\n")
    families = sorted({r["family"] for r, _ in rows})
    for fam in families:
        errs = [e for r, e in rows if r["family"] == fam]
        print(f"{fam:28} n={len(errs):2}  mean {statistics.mean(errs):+6.1%}  mean |error| "
              f"{statistics.mean(abs(e) for e in errs):5.1%}  worst {max(errs, key=abs):+6.1%}")
    parts = (("all runs", rows), ("held out", [x for x in rows if x[0].get("heldout")]),
             ("tuned-on", [x for x in rows if not x[0].get("heldout")]))
    # The runs each issue added, apart (part = "issue31"), and their held-out share.
    for part in sorted({r.get("part") for r, _ in rows} - {None}):
        parts += ((part, [x for x in rows if x[0].get("part") == part]),
                  (f"{part} held", [x for x in rows if x[0].get("part") == part and x[0].get("heldout")]))
    for label, subset in parts:
        if subset:
            errs = [abs(e) for _, e in subset]
            print(f"{label:10} n={len(errs):2}  MFU mean absolute error {statistics.mean(errs):.1%}, worst {max(errs):.1%}, "
                  f"sources {len({r['source'].split(',')[0].split(' (')[0] for r, _ in subset})}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
