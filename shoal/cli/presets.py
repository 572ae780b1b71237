"""`shoal presets`: the model presets with their total and active parameter counts."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("presets", help="list model presets with parameter counts")
    p.set_defaults(func=run)


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(int(n))


def run(args) -> int:
    from rich.table import Table

    from shoal.cli.console import console as make_console

    from shoal.model.analytics import flops_per_token, param_counts
    from shoal.model.config import PRESETS

    table = Table(title="shoal model presets")
    for col in ("preset", "layers", "dim", "heads/kv", "experts", "total params", "active params", "GFLOP/token"):
        table.add_column(col, justify="left" if col == "preset" else "right", no_wrap=True)
    for name, cfg in PRESETS.items():
        counts = param_counts(cfg)
        experts = f"{cfg.n_experts} top-{cfg.top_k}" + (f" +{cfg.n_shared_experts}" if cfg.n_shared_experts else "") if cfg.is_moe else "-"
        table.add_row(name, str(cfg.n_layers), str(cfg.dim), f"{cfg.n_heads}/{cfg.n_kv_heads}", experts,
                      _human(counts.total), _human(counts.active),
                      f"{flops_per_token(cfg, cfg.max_seq_len) / 1e9:.3g}")
    console = make_console()
    console.print(table)
    for name, cfg in PRESETS.items():
        if cfg.note:
            console.print(f"[bold]{name}[/]: {cfg.note}")
    print("GFLOP/token: model FLOPs for forward + backward at the preset's max_seq_len (6·N_active + 12·L·H·S).")
    return 0
