"""A sharded checkpoint read back in one process: what `shoal ckpt inspect` and `shoal ckpt export` use.

No process group is needed: DCP assembles every full tensor from whichever rank files hold its
pieces, whatever layout wrote them. Reading goes through safe_read (nothing is unpickled).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from shoal.checkpoint import store
from shoal.errors import UserError, first_line
from shoal.files import check_output_dir
from shoal.rundir.disk import errors_within
from shoal.rundir.names import (CHECKPOINTS, EXPORT_MARK, HF_EXPORT, MANIFEST, MODEL, MODEL_CONFIG, RUN_INFO,
                                list_checkpoints, what_shoal_wrote)
from shoal.model.config import ModelConfig


def find_checkpoints(path: Path) -> list[Path]:
    """A checkpoint directory itself, or every checkpoint under a checkpoint root or a run's --out."""
    path = Path(path)
    if (path / MANIFEST).exists() or (path / store.TRAIN_STATE).exists() or (path / ".metadata").exists():
        return [path]
    run = what_shoal_wrote(path) == "a run directory"
    for root in (path, _run_checkpoint_root(path) if run else path / CHECKPOINTS):
        found = [p for _, p in list_checkpoints(root)]
        if found:
            return found
    if run:  # a run that kept none: say what it has instead
        model = path / MODEL
        has = (f"its final weights are in {model} (`shoal ckpt export {path} --hf DIR` converts them)"
               if (model / MODEL_CONFIG).is_file() else "and no final model/ either (it stopped before its end)")
        raise UserError("checkpoint", str(path), f"is a run that kept no checkpoints (checkpoint.every=0, or none "
                                                 f"reached yet); {has}")
    raise UserError("checkpoint", str(path), "is neither a checkpoint directory nor a directory holding step_* "
                                             "checkpoints (pass a `shoal train --out` directory or its checkpoints/)")


def _run_checkpoint_root(run: Path) -> Path:
    """A run's checkpoint root, as its run.json records checkpoint.dir (<run>/checkpoints by default)."""
    try:
        configured = json.loads((run / RUN_INFO).read_text())["config"]["checkpoint"]["dir"]
    except (OSError, ValueError, KeyError, TypeError):
        configured = ""
    root = Path(configured).expanduser() if isinstance(configured, str) and configured else Path(CHECKPOINTS)
    return root if root.is_absolute() else run / root


def pick_checkpoint(path: Path) -> Path:
    """The checkpoint PATH names, or the newest intact one under it."""
    found = find_checkpoints(path)
    if len(found) == 1 and found[0] == Path(path):
        return found[0]
    chosen = store.newest_valid(found[0].parent)
    if chosen is None:
        raise UserError("checkpoint", str(path), "holds no intact checkpoint (see `shoal ckpt inspect`)")
    return chosen


def describe(directory: Path, checksums: bool = True) -> dict:
    """Step, layout, size and validity of one checkpoint."""
    found = store.problems(directory, checksums)
    info = {"path": str(directory), "valid": not found, "problems": found, "step": None, "layout": {},
            "bytes": sum(f.stat().st_size for f in directory.iterdir() if f.is_file()), "loss": None}
    try:
        state = store.read_train_state(directory)
        info.update(step=state.get("step"), layout=state.get("layout", {}), loss=state.get("loss"),
                    time=state.get("time"), model=state.get("model"))
    except (OSError, ValueError):
        pass
    return info


def load_full_state(directory: Path) -> tuple[dict[str, torch.Tensor], ModelConfig]:
    """The model's full (unsharded) weights from a checkpoint, by parameter name, and its config."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from shoal.checkpoint.safe_read import SafeReader, TensorsOnlyLoadPlanner, UnsafeCheckpoint, read_metadata
    from shoal.checkpoint.weights import first_nonfinite

    found = store.problems(directory)
    if found:
        raise UserError("checkpoint", str(directory), f"is damaged or incomplete: {found[0]}")
    try:
        cfg = ModelConfig(**store.read_train_state(directory)["model"]).validate()
    except (TypeError, UserError) as e:  # unknown or out-of-range model fields in train_state.json
        raise UserError("checkpoint", str(directory),
                        f"is damaged: {store.TRAIN_STATE} has a bad model table ({e})") from None
    try:
        metadata = read_metadata(directory)
        targets = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
                   for key, meta in metadata.state_dict_metadata.items() if key.startswith("model.")}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
            dcp.load(targets, storage_reader=SafeReader(directory), planner=TensorsOnlyLoadPlanner(), no_dist=True)
    except (Exception, CheckpointException) as e:  # DCP wraps the reading's error in a BaseException of its own
        cause = next(err for err in errors_within(e) if not isinstance(err, CheckpointException))
        if isinstance(cause, UnsafeCheckpoint):
            raise UserError("checkpoint", str(directory), f"refused: {cause}") from None
        # cut or garbled tensor data that its manifest agrees with (hashed after the damage, or by another tool)
        raise UserError("checkpoint", str(directory), f"is damaged: its tensor data cannot be read "
                                                      f"({first_line(cause)})") from None
    if bad := first_nonfinite(targets.items()):
        raise UserError("checkpoint", str(directory), f"is damaged: {bad} holds nan or inf")
    return {key.removeprefix("model."): value for key, value in targets.items()}, cfg


def check_export_folder(flag: str, out: Path) -> None:
    """The folder an export writes into: new, empty, or an earlier export's (which it replaces). Files
    of anything else there would be overwritten where their names are the export's, or mixed with it."""
    kind = what_shoal_wrote(out)
    if kind and kind != HF_EXPORT:  # its model.safetensors would be replaced
        raise UserError(flag, str(out), f"holds {kind}; the export's config.json and model.safetensors go in a "
                                        "folder of their own: give a new one")
    check_output_dir(flag, str(out), own=None if kind else ())


def pick_export_source(path: Path) -> Path:
    """What `shoal ckpt export PATH` converts: a model folder PATH (a run's model/), or the checkpoint
    PATH names (the newest intact one under it), or else the model/ a finished run left."""
    path = Path(path)
    if (path / MODEL_CONFIG).is_file():
        return path
    try:
        return pick_checkpoint(path)
    except UserError:
        if (path / MODEL / MODEL_CONFIG).is_file():  # a run that kept no checkpoints
            return path / MODEL
        raise


def export_hf(source: Path, out: Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write a consolidated Hugging Face checkpoint (config.json + model.safetensors) of the family
    that computes the model (shoal/model/hf_config.py), from a checkpoint or a model folder, with the
    tokenizer it was trained with (data/tokenizer_files.py) and its special tokens in config.json."""
    from shoal.checkpoint.weights import load_weights
    from shoal.data.tokenizer_files import write_hf_tokenizer
    from shoal.model.hf import save_hf
    from shoal.model.hf_config import export_family

    if (source / MODEL_CONFIG).is_file():
        model, cfg, tokenizer = load_weights(source)
        state, step = model.state_dict(), None
    else:
        state, cfg = load_full_state(source)
        tokenizer, step = _checkpoint_tokenizer(source), describe(source, checksums=False)["step"]
    export_family(cfg)  # refuses what no family computes before anything is written
    special_ids = write_hf_tokenizer(tokenizer, out) if tokenizer else {}
    path = save_hf(state, cfg, out, dtype=dtype, **special_ids)
    (Path(out) / EXPORT_MARK).write_text(json.dumps({"from": str(source), "step": step}, indent=1) + "\n")
    return path


def _checkpoint_tokenizer(directory: Path) -> str | None:
    """The tokenizer a checkpoint carries, or (checkpoints from before they carried one) the one its
    run recorded, where that is still there; None when neither is."""
    from shoal.data.tokenizer_files import TOKENIZER

    if (directory / TOKENIZER).is_file():
        return str(directory / TOKENIZER)
    recorded = store.read_train_state(directory).get("config", {}).get("data", {}).get("tokenizer")
    return recorded if recorded == "byte" or (isinstance(recorded, str) and Path(recorded).is_file()) else None
