"""The run's final weights written to <out>/model without gathering the model anywhere.

Tensor by tensor, in the plain model's order: the ranks holding a piece of it assemble it (a
DTensor's full_tensor is a collective among the ranks of its own mesh, all in one pipeline stage),
the lowest of them sends it to rank 0 unless that is rank 0 itself, and rank 0 appends it to the
safetensors file (safetensors_stream.py) and lets it go before the next one. So rank 0 holds at most
one full tensor beyond its own shard, whatever the model's size; `LiveBytes` measures that and
tests/dist/test_final_export.py checks it. Under pipeline parallelism each stage's lowest rank
sends its stage's tensors as rank 0 reaches them in the file's order.

The file reads back as the one `safetensors.torch.save_model` writes for the one-process model (the
same tensors and metadata; a tied weight kept once, under the name save_model keeps), so
`shoal generate` and load_weights read it unchanged.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from shoal.checkpoint.safetensors_stream import SafetensorsStream
from shoal.checkpoint.weights import WEIGHTS, write_config
from shoal.model.config import ModelConfig
from shoal.model.transformer import build_model


class LiveBytes:
    """Bytes of the tracked tensors still alive, and the most alive at once, per device type.

    A tensor counts from `track` until Python frees it (weakref.finalize): a full tensor kept by
    mistake keeps counting, which is what makes the peak a measurement."""

    def __init__(self):
        self.now: Counter = Counter()
        self.peak: Counter = Counter()

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        kind, n = tensor.device.type, tensor.numel() * tensor.element_size()
        self.now[kind] += n
        self.peak[kind] = max(self.peak[kind], self.now[kind])
        weakref.finalize(tensor, self._free, kind, n)
        return tensor

    def _free(self, kind: str, n: int) -> None:
        self.now[kind] -= n


def file_layout(model_cfg: ModelConfig) -> tuple[dict[str, tuple[tuple[int, ...], torch.dtype]], dict[str, str]]:
    """The tensors the weights file holds ({name: (shape, dtype)}, in model order) and the tied names
    left out ({dropped: kept}), exactly as safetensors.torch.save_model chooses them."""
    model = build_model(model_cfg, device="meta")  # shapes and dtypes only; nothing allocated
    state, groups = model.state_dict(keep_vars=True), {}
    for name, value in state.items():
        groups.setdefault(id(value), []).append(name)
    specs, dropped = {}, {}
    for names in groups.values():
        kept = sorted(names)[0]  # save_model keeps the first name in sorted order of a shared tensor
        specs[kept] = (tuple(state[kept].shape), state[kept].dtype)
        dropped.update({name: kept for name in names if name != kept})
    return specs, dropped


def local_tensors(modules: list[nn.Module]) -> dict[str, torch.Tensor]:
    """This rank's share of the model by plain parameter name (DTensors under FSDP/TP/EP)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from shoal.checkpoint.state import model_view

    return get_model_state_dict(model_view(modules))


def write_final_weights(modules: list[nn.Module], model_cfg: ModelConfig, tokenizer: str, directory: Path,
                        rt) -> LiveBytes:
    """Collective: every rank calls it. Rank 0 writes directory/model.safetensors + the config and
    returns what it measured (on the other ranks the counts stay 0).

    A write that fails on rank 0 (a full disk, a read-only one) stops its writing, not the
    collectives: it goes on assembling and dropping the remaining tensors, and then every rank
    raises that OSError, so the run stops together, with no partial file left."""
    # Assembling 2-D sharded (FSDP x EP) weights takes two all-gathers; DTensor warns about it, once per tensor.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    specs, dropped = file_layout(model_cfg)
    local = local_tensors(modules)
    holders = _holders(local, specs, rt)
    live = LiveBytes()
    file = _RankZeroFile(directory, specs, dropped) if rt.is_main else None
    for name, (shape, dtype) in specs.items():
        _one_tensor(name, shape, dtype, local, holders[name], file, live, rt)
    failed = file.finish(lambda: write_config(directory, model_cfg, tokenizer)) if file else None
    _raise_on_every_rank(failed, rt)
    return live


class _RankZeroFile:
    """Rank 0's end of the export: the safetensors stream until a write fails, then the error."""

    def __init__(self, directory: Path, specs: dict, dropped: dict):
        self.stream, self.failed = None, None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self.stream = SafetensorsStream(directory / WEIGHTS, specs, dropped)
        except OSError as e:
            self.failed = e

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if self.failed is None:
            try:
                self.stream.write(name, tensor)
            except OSError as e:
                self.failed = e

    def finish(self, write_config) -> OSError | None:
        """The config, then the weights renamed into place (the last write: the model exists once it
        does, see checkpoint/choose.py); on any failure the partial file is removed."""
        if self.failed is None:
            try:
                write_config()
                self.stream.close()
            except OSError as e:
                self.failed = e
        if self.failed is not None and self.stream is not None:
            self.stream.discard()
        return self.failed


def _raise_on_every_rank(failed: OSError | None, rt) -> None:
    """Rank 0's outcome, the same on every rank (one small broadcast)."""
    import torch.distributed as dist

    if rt.world_size > 1:
        box = [None if failed is None else (failed.errno, failed.strerror or str(failed), failed.filename)]
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None and failed is None:
            failed = OSError(*box[0])
    if failed is not None:
        raise failed


def _one_tensor(name, shape, dtype, local, source: int, file: _RankZeroFile | None, live: LiveBytes, rt) -> None:
    """Assemble one full tensor, bring it to rank 0 and write it there; it is freed on return."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    full = None
    if name in local:
        piece = local[name].detach()
        full = piece.full_tensor() if isinstance(piece, DTensor) else piece  # collective on its own mesh
        if rt.is_main and isinstance(piece, DTensor):
            live.track(full)
    if rt.rank == source != 0:
        dist.send(full.contiguous(), dst=0)
        if full.is_cuda:  # NCCL's send returns before the bytes left: keep one tensor in flight, not all
            torch.cuda.current_stream().synchronize()
    if rt.is_main:
        if source != 0:
            full = live.track(torch.empty(shape, dtype=dtype, device=rt.device))
            dist.recv(full, src=source)
        host = full.cpu()
        if host is not full:
            live.track(host)
        file.write(name, host)


def _holders(local: dict[str, torch.Tensor], specs: dict, rt) -> dict[str, int]:
    """For each tensor of the file, the lowest rank that holds (a piece of) it."""
    import torch.distributed as dist

    if rt.world_size == 1:
        everyone = [sorted(local)]
    else:
        everyone = [None] * rt.world_size
        dist.all_gather_object(everyone, sorted(n for n in local if n in specs))  # names only: a few KB
    holders = {}
    for rank, names in enumerate(everyone):
        for name in names:
            holders.setdefault(name, rank)
    missing = [n for n in specs if n not in holders]
    assert not missing, f"no rank holds {missing[:3]}"
    return holders
