"""`shoal plan --report DIR`: the pictures of a plan before any run, in one page.

The best layout's rank grid on the cluster's nodes, its memory stack against the device's
capacity, its step-time breakdown, and (with --scale) the scaling curve with the wall marked.
The figure code is the run report's and `plan --figures`' own.
"""

from __future__ import annotations

from pathlib import Path

from shoal.files import filling
from shoal.report.html import Figure, Section, render

SECTION_IDS = ("summary", "rank-grid", "memory", "step-time", "scaling")


def write_plan_report(out: str | Path, best, cluster, model_name: str, points=None) -> Path:
    """Write <out>/index.html and the figures; return the page. `best` may be None (nothing fits).
    A failure part way leaves no half page, nor the folders made for it."""
    with filling(Path(out)) as folder:
        return _write(folder, best, cluster, model_name, points)


def _write(out: Path, best, cluster, model_name: str, points) -> Path:
    from shoal.parallel.mesh import ParallelDims
    from shoal.planner.render import breakdown_lines, headline
    from shoal.report import plan_figures
    from shoal.report.rank_grid import rank_grid_figure

    summary = Section("summary", "Summary", paragraphs=[headline(best.workload, cluster, model_name)] if best else [])
    grid, mem, time = Section("rank-grid", "Rank grid"), Section("memory", "Memory"), Section("step-time", "Step time")
    scaling = Section("scaling", "Scaling")
    if best is None and points:
        summary.notes.append("the scaling sweep only: give --gpus N (a count where a layout fits) for that layout's "
                             "rank grid, memory and step time")
    elif best is None:
        summary.notes.append("no layout fits in memory: add GPUs, use a larger device, or shorten the sequence")
    else:
        summary.table = [("best layout", best.layout.short()), ("fits", "yes" if best.fits else "NO")]
        summary.paragraphs += breakdown_lines(best)
        dims = ParallelDims.of(best.layout)
        png = rank_grid_figure(dims, cluster.gpus_per_node, out / "plan_rank_grid")[0]
        grid.figures.append(Figure(png, f"The {dims.world_size} ranks of {best.layout.short()} on nodes of "
                                        f"{cluster.gpus_per_node}, coloured by their TP, PP, DP and EP groups.",
                                   "The best layout's rank grid on the cluster's nodes (red border: the group "
                                   "crosses a node)."))
        png = plan_figures.memory_figure([best], out / "plan_memory")[0]
        mem.figures.append(Figure(png, "One stacked bar of the predicted GiB per GPU by part, with a dashed line at "
                                       "the device's capacity.", "Predicted memory per GPU against the capacity."))
        png = plan_figures.time_figure([best], out / "plan_time")[0]
        time.figures.append(Figure(png, "One stacked bar of the predicted seconds per step: compute, recompute, "
                                        "communication by kind, bubble and optimizer.", "Predicted step-time breakdown."))
    if points:
        png = plan_figures.scaling_figure(points, out / "plan_scaling")[0]
        scaling.figures.append(Figure(png, "Two line charts over GPU count: tokens per second of the best layout, "
                                           "and per-GPU efficiency, with the communication wall marked.",
                                      "Scaling with a fixed global batch and a fixed per-GPU batch; dotted lines mark "
                                      "where adding GPUs stops paying off."))
    else:
        scaling.paragraphs.append("Add --scale A:B to draw the scaling curve over GPU counts A..B.")
    page = out / "index.html"
    page.write_text(render(f"shoal plan: {model_name}", [summary, grid, mem, time, scaling]))
    return page
