"""`shoal ckpt inspect PATH` and `shoal ckpt export PATH --hf DIR`: look at and convert checkpoints.

PATH is a checkpoint directory (step_*), a checkpoint root, or a `shoal train --out` directory
(export also takes a model/ folder).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from shoal.cli.argtypes import non_empty


def register(sub) -> None:
    p = sub.add_parser("ckpt", help="inspect sharded training checkpoints or export one to Hugging Face format")
    cmds = p.add_subparsers(dest="ckpt_command", required=True)
    i = cmds.add_parser("inspect", help="step, layout, size and validity of each checkpoint")
    i.add_argument("path", type=non_empty("runs/first"), help="a checkpoint, a checkpoint root or a `shoal train --out` directory")
    i.add_argument("--no-checksums", action="store_true", help="check sizes only (fast for large checkpoints)")
    i.set_defaults(func=inspect)
    e = cmds.add_parser("export", help="write a consolidated Hugging Face checkpoint (Llama, Mistral, Qwen2/3, Mixtral, "
                                       "Qwen3-MoE: the family that computes the model)")
    e.add_argument("path", type=non_empty("runs/first"), help="a checkpoint (default: the newest intact one under a root or "
                                                              "--out directory, else the run's model/), or a model/ folder")
    e.add_argument("--hf", required=True, metavar="DIR", help="output directory (config.json + model.safetensors + the "
                                                             "tokenizer's files)")
    e.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    e.set_defaults(func=export)


def inspect(args) -> int:
    from rich.table import Table

    from shoal.cli.console import console as make_console
    from shoal.checkpoint.checkpointer import layout_text
    from shoal.checkpoint.export import describe, find_checkpoints

    infos = [describe(p, checksums=not args.no_checksums) for p in find_checkpoints(Path(args.path))]
    roots = sorted({str(Path(info["path"]).parent) for info in infos})
    table = Table(title=f"shoal checkpoints in {', '.join(roots)}")
    for col in ("step", "layout", "size", "loss", "saved", "valid"):
        table.add_column(col, justify="right" if col in ("step", "size", "loss") else "left", no_wrap=True)
    for info in infos:
        saved = datetime.datetime.fromtimestamp(info["time"]).strftime("%m-%d %H:%M:%S") if info.get("time") else "?"
        table.add_row("?" if info["step"] is None else str(info["step"]),  # None: train_state.json unreadable
                      layout_text(info["layout"], zero=True), f"{info['bytes'] / 1e6:.1f} MB", loss_text(info["loss"]),
                      saved, "yes" if info["valid"] else "[bold red]NO[/]")
    console = make_console()
    console.print(table)
    for info in infos:
        for problem in info["problems"]:
            console.print(f"[bold red]damaged:[/] {problem}", highlight=False, soft_wrap=True)
    return 0 if all(info["valid"] for info in infos) else 1


def loss_text(loss: float | None) -> str:
    """A loss in at most a dozen characters: 5 significant digits are the 4 decimals a loss from 1 to 10
    is read to, and a diverged 1e300 stays 1e+300 rather than 300 digits that push the table off the page."""
    return "-" if loss is None else f"{loss:.5g}"


def export(args) -> int:
    import torch

    from shoal.checkpoint.export import check_export_folder, export_hf, pick_export_source

    check_export_folder("--hf", Path(args.hf))
    chosen = pick_export_source(Path(args.path))
    out = export_hf(chosen, Path(args.hf), dtype=getattr(torch, args.dtype))
    architecture = json.loads((out / "config.json").read_text())["architectures"][0]
    print(f"exported {chosen} -> {out} (Hugging Face {architecture}, {args.dtype})")
    return 0
