"""`shoal doctor`'s picture: bus bandwidth and time per op over message size.

Matplotlib with the Agg backend, imported only when the figure is drawn.
"""

from __future__ import annotations

from pathlib import Path

COLORS = {"all_reduce": "#4c72b0", "all_gather": "#55a868", "reduce_scatter": "#8172b2",
          "all_to_all": "#dd8452", "broadcast": "#c44e52", "sendrecv": "#937860"}


def _size_label(n: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def plot_bandwidth(rows, world: int, backend: str, path: Path) -> Path:
    """Two panels sharing the size axis: busbw (GB/s, nccl-tests definition) and time (us)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    for op in dict.fromkeys(r.op for r in rows):
        mine = sorted((r for r in rows if r.op == op), key=lambda r: r.size)
        sizes = [r.size for r in mine]
        color = COLORS.get(op)
        ax_bw.plot(sizes, [r.busbw / 1e9 for r in mine], marker="o", ms=3, label=op, color=color)
        ax_t.plot(sizes, [r.time_s * 1e6 for r in mine], marker="o", ms=3, label=op, color=color)
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _size_label(v)))
        ax.set_xlabel("message size (bytes, as nccl-tests counts them)")
        ax.grid(True, which="major", alpha=0.3)
    ax_bw.set_ylabel("bus bandwidth (GB/s, 1e9 B/s)")
    ax_bw.set_title(f"busbw, {world} ranks on {backend}")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per op (us, slowest rank)")
    ax_t.set_title("latency")
    ax_bw.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
