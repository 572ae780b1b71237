"""The weights of a pretrained folder (`model.init_from`, read by shoal/pretrained.py), served by shoal's
parameter names: the whole tensor, or only the part a rank holds (safetensors reads slices). Both
readers check every name and shape against the model before any data is read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from shoal.errors import UserError
from shoal.model.hf import HFWeights, Index
from shoal.model.transformer import build_model
from shoal.pretrained import open_pretrained
from shoal.rundir.names import MODEL_WEIGHTS


class ShoalWeights:
    """A shoal model folder's model.safetensors (shoal's names already; a tied weight stored once,
    under either of its names, as safetensors.torch.save_model keeps it)."""

    def __init__(self, folder: Path, cfg):
        self.path = folder / MODEL_WEIGHTS
        self.expected = {n: tuple(p.shape) for n, p in build_model(cfg, device="meta").named_parameters()}
        if not self.path.is_file():
            raise UserError("model.init_from", str(folder), f"has no {MODEL_WEIGHTS}; the run that wrote it did not "
                                                            "finish, or it was moved")
        try:
            with safe_open(str(self.path), framework="pt") as f:
                stored = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
        except Exception as e:  # safetensors raises its own error types for a truncated or garbled file
            raise UserError("model.init_from", str(folder), f"{MODEL_WEIGHTS} cannot be read ({type(e).__name__})") from None
        self.stored_as = {}
        tied = ("tok_embeddings.weight", "output.weight") if cfg.tie_embeddings else ()
        for name, shape in self.expected.items():
            found = name if name in stored else next((t for t in tied if t in stored and name in tied), None)
            if found is None or stored[found] != shape:
                raise UserError("model.init_from", str(folder), f"{MODEL_WEIGHTS} has {name} as "
                                                                f"{stored.get(found, 'missing')}, the model needs {shape}")
            self.stored_as[name] = found

    def read(self, name: str, index: Index | None = None) -> torch.Tensor:
        with safe_open(str(self.path), framework="pt") as f:
            part = f.get_slice(self.stored_as[name])
            return part[index] if index is not None else part[:]


@dataclass
class PretrainedWeights:
    """A folder's reader, whose every block is checked finite as it is read (training from NaN would
    only report a NaN loss, later); refuse_nonfinite then says so on every rank alike."""

    folder: Path
    reader: HFWeights | ShoalWeights
    nonfinite: str | None = None
    """The first tensor this rank found NaN or infinity in."""

    def read(self, name: str, index: Index | None = None) -> torch.Tensor:
        block = self.reader.read(name, index)
        if self.nonfinite is None and not torch.isfinite(block).all():
            self.nonfinite = name
        return block

    def refuse_nonfinite(self) -> None:
        """Collective over the default process group, once every rank has read its share: one UserError on
        every rank when any found NaN or infinity. A rank that raised alone, as it read, left its peers
        waiting in their next collective until the launcher killed them (30 s), and the one line was its
        to say: a rank other than a node's first stopped the run without a word."""
        import torch.distributed as dist

        found = [self.nonfinite]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            found = [None] * dist.get_world_size()
            dist.all_gather_object(found, self.nonfinite)
        if name := next((n for n in found if n), None):
            raise UserError("model.init_from", str(self.folder), f"{name} holds NaN or infinite values; the folder "
                                                                 "is damaged or was saved from a diverged run")


def open_weights(path: str, cfg) -> PretrainedWeights:
    """The weights of the folder at `path` (model.init_from), for the model `cfg` (the folder's, as the
    job resolved it)."""
    pretrained = open_pretrained(path)
    if pretrained.kind == "shoal":
        return PretrainedWeights(pretrained.folder, ShoalWeights(pretrained.folder, cfg))
    try:
        return PretrainedWeights(pretrained.folder, HFWeights(pretrained.folder, cfg))
    except UserError as e:  # the folder's own words, said as model.init_from's
        raise UserError("model.init_from", str(pretrained.folder), f"{e.field}={e.value!r}: {e.fix}") from None
