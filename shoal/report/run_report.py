"""`shoal report RUN_DIR`: the run's pictures and one page that holds them all.

Each section comes from one source: metrics.jsonl (training, communication, stragglers),
run.json (rank grid, pipeline schedule), the planner on the run's own layout (prediction).
"""

from __future__ import annotations

from pathlib import Path

from shoal.files import filling
from shoal.report.html import Figure, Section, render
from shoal.rundir.names import REPORT
from shoal.rundir.run import Run, load_run

SECTION_IDS = ("summary", "training", "rank-grid", "pipeline", "memory", "communication", "stragglers", "prediction",
               "profile")
NEEDS = ("config.train.global_batch", "config.train.seq_len", "config.model", "layout", "world")
"""The run.json fields this page reads, beyond what load_run reads itself (it checks all their kinds)."""


def build_report(run_dir: Path, out: Path | None = None, allow_partial: bool = False) -> Path:
    """Write <out>/index.html and <out>/*.png|svg (out defaults to <run_dir>/report); return the page.

    Everything that can refuse the run comes before the first file is written (the prediction
    re-plans an older run from its stored config, which the planner may reject), so a refusal
    leaves no half-written report behind."""
    from shoal.report.run_figures import steady_measurement

    run = load_run(run_dir, allow_partial=allow_partial, need=NEEDS)
    measured = steady_measurement(run) if run.rows else None
    found = None
    if run.info and run.rows:
        from shoal.report.predict import predict

        found = predict(run.info, measured)
    with filling(out or run_dir / REPORT) as out:  # a failure nobody foresaw leaves no half report either
        sections = [summary_section(run), training_section(run, out), grid_section(run, out),
                    pipeline_section(run, out), *measured_sections(run, out, measured, found),
                    profile_section(run_dir)]
        assert [s.id for s in sections] == list(SECTION_IDS)
        page = out / "index.html"
        page.write_text(render(f"shoal run report: {run_dir.resolve().name}", sections))
    return page


def _layout(run: Run):
    from shoal.layout import Layout

    return Layout(**run.info["layout"]) if run.info else None


def summary_section(run: Run) -> Section:
    from shoal.report.run_figures import steady_measurement

    s = Section("summary", "Summary", notes=list(run.notes))
    lay = _layout(run)
    if run.info:
        s.table += [("ranks", f"{run.info['world']} ({run.info.get('local_world', run.info['world'])} per node, "
                              f"{run.info.get('device_name', run.info.get('device'))})"),
                    ("layout", lay.short()), ("model", run.info["config"]["model"].get("preset", "?"))]
        s.table += setup_rows(run.info, lay)
    if run.rows:
        m = steady_measurement(run)
        last = run.rows[-1]
        ev = [r for r in run.rows if "eval_loss" in r]
        s.table += [("steps", f"{run.last_step}" + (f" of {run.total_steps}" if run.total_steps else "")),
                    ("last loss", f"{last['loss']:.4f}"), ("last eval loss", f"{ev[-1]['eval_loss']:.4f}" if ev else "-"),
                    ("tokens", f"{last.get('tokens', 0):,}"),
                    ("step time (median, warm-up left out)", f"{m['step_time_s']:.3f} s"),
                    ("MFU (median, model FLOPs)", f"{m['mfu']:.2%}"),
                    ("checkpoints at steps", ", ".join(map(str, run.checkpoints)) or "-"),
                    ("restarts from steps", ", ".join(map(str, run.restarts)) or "-")]
    return s


def training_section(run: Run, out: Path) -> Section:
    from shoal.report.run_figures import training_figure

    s = Section("training", "Training")
    if not run.rows:
        s.notes.append("no steps written yet")
        return s
    png = training_figure(run, out / "training")[0]
    s.figures.append(Figure(png, "Four charts over training steps: train and eval loss top left; tokens per second "
                                 "and MFU top right; the learning rate bottom left; the gradient norm bottom right; "
                                 "vertical lines mark evaluations, checkpoints and restarts.",
                            "Loss and eval loss, tokens/s and MFU (top); learning rate and gradient norm (bottom). "
                            "Dotted purple: evaluation; dashed green: checkpoint; solid red: restart."))
    return s


def grid_section(run: Run, out: Path) -> Section:
    from shoal.parallel.mesh import ParallelDims
    from shoal.report.rank_grid import grid_geometry, rank_grid_figure

    s = Section("rank-grid", "Rank grid")
    if not run.info:
        s.notes.append("no run.json: the layout is unknown")
        return s
    dims, per_node = ParallelDims.of(_layout(run)), run.info.get("local_world", run.info["world"])
    png = rank_grid_figure(dims, per_node, out / "rank_grid")[0]
    geo = grid_geometry(dims, per_node)
    crossing = [f"{k} {g}" for k, gs in geo["crossing"].items() for g in gs]
    axes, _ = dims.shown_grid()
    s.paragraphs.append(f"{dims.world_size} ranks as " + "".join(f"[{a} {getattr(dims, a)}]" for a in axes)
                        + (f", ep {dims.ep} inside dp_shard" if dims.ep > 1 else "")
                        + f", {geo['per_node']} per node. Groups crossing a node: " + (", ".join(crossing) or "none") + ".")
    s.figures.append(Figure(png, f"The {dims.world_size} ranks drawn as boxes on their nodes, once per kind of group, "
                                 "each group in its own colour; groups that span nodes have red borders.",
                            "Every rank on its node and device, coloured by its group in each kind of parallelism."))
    return s


def pipeline_section(run: Run, out: Path) -> Section:
    from shoal.report.schedule import simulate, textbook_bubble
    from shoal.report.schedule_figure import schedule_figure

    s = Section("pipeline", "Pipeline schedule")
    lay = _layout(run)
    if lay is None or lay.pp == 1:
        s.paragraphs.append("No pipeline (pp = 1): every rank runs every layer, so there is no bubble."
                            if lay else "The layout is unknown (no run.json).")
        return s
    m = lay.microbatches(run.info["config"]["train"]["global_batch"])
    try:
        tl = simulate(lay.pp_schedule, lay.pp, m, lay.virtual_stages)
    except (AssertionError, ValueError) as e:  # one picture that cannot be laid out must not cost the page
        s.notes.append(f"the {lay.pp_schedule} schedule for pp={lay.pp}, {m} micro-batches could not be laid out: {e}")
        return s
    png = schedule_figure(tl, out / "pipeline")[0]
    text = f"{lay.pp_schedule} with {lay.pp} stages and {m} micro-batches: bubble {tl.bubble_fraction:.1%} of the step"
    if lay.pp_schedule in ("gpipe", "1f1b"):
        text += f" (the textbook (p-1)/(m+p-1) = {textbook_bubble(lay.pp, m):.1%})"
    s.paragraphs.append(text + ". Order of work from torch.distributed.pipelining's own schedule; times in units "
                               "of one forward, sends taken as free.")
    s.figures.append(Figure(png, f"Timeline of the {lay.pp_schedule} pipeline schedule: one row per pipeline rank, "
                                 "forward, backward and weight-gradient blocks per micro-batch, grey for idle time.",
                            f"The {lay.pp_schedule} schedule per rank over time; bubble {tl.bubble_fraction:.1%}."))
    return s


def measured_sections(run: Run, out: Path, measured: dict | None, found) -> list[Section]:
    """`measured`: rf.steady_measurement(run); `found`: the run's prediction (report/predict.py), or None."""
    from shoal.report import run_figures as rf

    mem, comm = Section("memory", "Memory per rank"), Section("communication", "Communication")
    strag, pred_s = Section("stragglers", "Step-time spread (stragglers)"), Section("prediction", "Predicted vs measured")
    if not run.rows:
        for s in (mem, comm, strag, pred_s):
            s.notes.append("no steps written yet")
        return [mem, comm, strag, pred_s]
    pred = found.pred if found else None
    memory_section(mem, run, measured, pred, out)
    if pred:
        plan_cmd = _plan_command(run)
        pred_s.paragraphs.append(f"The planner on this run's own layout: {plan_cmd}")
        if found.source:
            pred_s.notes.append(found.source)
        if pred.why_no_time:
            pred_s.notes.append(f"no step-time or MFU prediction: {pred.why_no_time}")
        png = rf.predicted_figure(measured, pred, out / "prediction")[0]
        timed = pred.step_time_s is not None
        pred_s.table = [("step time (s)", f"predicted {pred.step_time_s:.3f}, measured {measured['step_time_s']:.3f}"
                         if timed else f"measured {measured['step_time_s']:.3f}"),
                        ("peak memory (GiB)", f"predicted {pred.memory.total / 2**30:.2f}, "
                                              f"measured {measured['peak_mem_bytes'] / 2**30:.2f}"),
                        ("MFU", f"predicted {pred.mfu:.2%}, measured {measured['mfu']:.2%}" if pred.mfu is not None
                         else f"measured {measured['mfu']:.2%}")]
        pred_s.figures.append(Figure(png, "Three pairs of bars: predicted and measured step time, peak memory and MFU.",
                                     "Predicted (planner) vs measured (median of the steady steps)."))
    else:
        pred_s.notes.append("no run.json: the layout is unknown, so there is no prediction")
    png = rf.comm_figure(run, out / "communication")[0]
    comm.paragraphs.append(comm_paragraph(run))
    comm.figures.append(Figure(png, "Left: stacked bars per step of the mebibytes rank 0 sent, by collective. Right: "
                                    "the mean per steady step by parallel dimension, stacked by collective.",
                               "Bytes rank 0 sent per step by collective (left) and by the parallel dimension "
                               "whose group carried them (right), as counted by shoal's comm counter."))
    rows = [r for r in run.rows if "compute_time_spread" in r]
    if rows:
        named = sorted({k for r in rows for k in r.get("stragglers", [])})
        strag.paragraphs.append(("Stragglers (below 0.7x the median speed on some step): ranks "
                                 + ", ".join(map(str, named))) if named else "No rank fell below 0.7x the median speed.")
        png = rf.straggler_figure(run, out / "stragglers", world=run.info["world"] if run.info else None)[0]
        strag.figures.append(Figure(png, "Left: the slowest rank's compute time over the median, per step, with the "
                                         "straggler threshold. Right: how many steps each rank was the slowest.",
                                    "Step-time spread across ranks and the slowest rank per step."))
    else:
        strag.paragraphs.append("One rank: no spread to show.")
    return [mem, comm, strag, pred_s]


def memory_section(mem: Section, run: Run, measured: dict, pred, out: Path) -> None:
    from shoal.report import run_figures as rf

    by_rank = rf.latest_memory_by_rank(run)
    if not (pred or by_rank):
        mem.notes.append("no run.json and no per-rank memory in metrics.jsonl: nothing to draw")
        return
    mem.paragraphs.append(memory_paragraph(run, measured, pred, by_rank))
    png = rf.memory_figure(measured, pred.memory if pred else None, out / "memory", by_rank)[0]
    shown = rf.ranks_to_draw(by_rank) if by_rank else [0]
    which = (f"ranks {', '.join(map(str, shown))} (the {len(shown)} highest peaks of {len(by_rank['peak'])})"
             if by_rank and len(shown) < len(by_rank["peak"]) else "each rank" if by_rank else "rank 0")
    mem.figures.append(Figure(png, "Stacked horizontal bars in GiB: "
                                   + ("the planner's predicted memory split into parameters, gradients, optimizer, "
                                      "activations, logits, buffers and overhead; then " if pred else "")
                                   + f"the measured parameters, gradients, optimizer state, activations and the rest "
                                     f"of the peak for {which}.",
                              "Memory per rank: " + ("predicted breakdown (planner) beside " if pred else "")
                              + f"the measurement of {which}; hatched segments are measured."))


def memory_paragraph(run: Run, measured: dict, pred, by_rank: dict | None) -> str:
    if not by_rank:
        return ("This run's metrics.jsonl records rank 0 only (it predates per-rank memory): its measured "
                "parameters, gradients and optimizer state, and its peak"
                + (f"; the planner's bar is the busiest rank ({pred.memory.stage} pipeline stage)." if pred else "."))
    peaks = by_rank["peak"]
    busiest = max(range(len(peaks)), key=lambda r: peaks[r] or 0)
    text = (f"Measured on every rank: parameters, gradients and optimizer state from the tensors each holds, "
            f"activations as the peak of what autograd saved for backward on the first step, and the peak "
            f"({measured['what']}). Busiest rank: {busiest}, {peaks[busiest] / 2**30:.2f} GiB.")
    acts = [a for a in by_rank.get("activations", []) if a is not None]
    if pred and acts:
        text += (f" Activations: largest measured {max(acts) / 2**30:.3f} GiB vs {pred.memory.activations / 2**30:.3f} "
                 f"GiB predicted for the busiest rank ({pred.memory.stage} pipeline stage).")
    elif not acts:
        text += " Activations were not measured (train.compile, or a run that stopped in its first step)."
    return text


def comm_paragraph(run: Run) -> str:
    from shoal.report.run_figures import mean_bytes_by_dim
    from shoal.rundir.metrics import steady_rows

    by_dim = mean_bytes_by_dim(steady_rows(run.rows, run.starts))
    if not by_dim:
        return "Bytes by parallel dimension were not recorded (one rank, or a run from before they were)."
    totals: dict[str, float] = {}
    for key, v in by_dim.items():
        totals[key.split(":")[1]] = totals.get(key.split(":")[1], 0.0) + v
    parts = ", ".join(f"{d} {v / 2**20:.2f} MiB" for d, v in sorted(totals.items(), key=lambda kv: -kv[1]))
    return f"Rank 0 sends per steady step, by parallel dimension: {parts}."


def setup_rows(info: dict, lay) -> list[tuple[str, str]]:
    """What the run trained on and how: data, tokenizer, vocabulary, sequence length, batch, learning rate."""
    cfg = info["config"]
    t, d, vocab = cfg["train"], cfg.get("data", {}), info.get("model", {}).get("vocab_size")
    seq, batch = t["seq_len"], t["global_batch"]
    return [("data", str(d.get("path", "?"))), ("tokenizer", str(d.get("tokenizer", "?"))),
            ("vocabulary", f"{vocab:,} ids (model.vocab_size)" if isinstance(vocab, int) else "?"),
            ("sequence length", f"{seq} tokens"),
            ("batch", f"{batch} sequences = {batch * seq:,} tokens per step (micro-batch {lay.micro_batch} per rank)"),
            ("learning rate", f"{t.get('lr')} peak ({t.get('optimizer', 'adamw')}), {t.get('warmup_steps')} warm-up "
                              f"steps, cosine to {t.get('min_lr_ratio')}x")]


def profile_section(run_dir: Path) -> Section:
    """debug.profile_steps' summaries (shoal/rundir/profile_summary.py): time split and top ops per traced rank."""
    from shoal.rundir.profile_summary import read_summaries

    s = Section("profile", "Profile (torch.profiler)")
    found = read_summaries(run_dir)
    if not found:
        s.paragraphs.append("No profile: set debug.profile_steps (e.g. 3-4) and debug.profile_ranks to record "
                            "torch.profiler traces of a few steps.")
        return s
    steps = found[0]["steps"]
    s.paragraphs.append(f"Steps {', '.join(map(str, steps))} traced on rank{'s' if len(found) > 1 else ''} "
                        f"{', '.join(str(f['rank']) for f in found)}; time split from {found[0]['busy_source']} "
                        "(communication: collective ops and their waits; idle: no op running). Open the traces "
                        "in https://ui.perfetto.dev: " + ", ".join(f"profile/{f['trace']}" for f in found) + ".")
    for f in found:
        total = f["step_us"] or 1.0
        s.table.append((f"rank {f['rank']}", f"{f['step_us'] / 1e3:.1f} ms over {len(f['steps'])} steps: compute "
                                              f"{f['compute_us'] / total:.0%}, communication {f['comm_us'] / total:.0%}, "
                                              f"idle {f['idle_us'] / total:.0%}"))
    for f in found[:1]:
        top = ", ".join(f"{op['name']} {op['self_us'] / 1e3:.1f} ms ({op['calls']}x)" for op in f["top_ops"][:10])
        s.paragraphs.append(f"Top ops on rank {f['rank']} by self time: {top}.")
    return s


def _plan_command(run: Run) -> str:
    lay, t = _layout(run), run.info["config"]["train"]
    cmd = (f"shoal plan {_plan_model_flags(run.info)} --seq-len {t['seq_len']} "
           f"--global-batch {t['global_batch']} --gpus {run.info['world']} --tp {lay.tp} --pp {lay.pp} --dp {lay.dp} "
           f"--zero {lay.zero} --micro-batch {lay.micro_batch} --activation-checkpoint {lay.activation_checkpoint}")
    if lay.pp > 1:
        cmd += f" --pp-schedule {lay.pp_schedule}"
    if lay.ep > 1:
        cmd += f" --ep {lay.ep}"
    return cmd + (" --gpu local" if run.info.get("device") == "cpu" else "")


def _plan_model_flags(info: dict) -> str:
    """--model and a shape flag for every field where the model the run trained differs from it: the
    overrides, and what the data set (a tokenizer's vocabulary), so the planner sees the same model."""
    import shlex

    from shoal.model.config import get_preset
    from shoal.planner.request import SHAPE_FLAGS

    section = info["config"]["model"]
    base = section.get("init_from") or section.get("preset")
    if section.get("init_from"):
        from shoal.pretrained import open_pretrained

        preset = open_pretrained(base, field="model.init_from").model
    else:
        preset = get_preset(base)
    trained = info.get("model", {})
    flags = [f"--{flag.replace('_', '-')} {trained[name]}" for name, flag in SHAPE_FLAGS.items()
             if name in trained and trained[name] != getattr(preset, name)]
    return " ".join([f"--model {shlex.quote(str(base))}", *flags])
