"""What a checkpoint holds: tensors keyed by the model's own parameter names, for any layout.

    model.<fqn>                    a parameter (a DTensor shard under FSDP/TP/EP, plain otherwise)
    optim.state.<fqn>.<name>       AdamW's step, exp_avg, exp_avg_sq for that parameter
    rng.cpu.<rank>, rng.cuda.<rank> each rank's random-number generator state (uint8)
    compress.<rank>.<name>         gradient compression state (error feedback, PowerSGD's Q, its
                                   step), different on every rank, keyed by parameter name
                                   (parallel/compression.py); loaded back by the same rank
    diloco.outer.<fqn>, diloco.momentum.<fqn>   DiLoCo's outer parameters and Nesterov momentum
    diloco.replica<g>.model.*, .optim.*         replica group g's own parameters and optimizer
                                   state (the groups differ between outer steps; parallel/diloco.py)

Names are the plain model's (`layers.7.attention.wq.weight`): pipeline stages keep them, and the
wrappers' prefixes (DDP's `module.`, the activation-checkpoint wrapper's) are stripped. So one
DCP save over all ranks writes the whole model once, and any other layout loads it by name:
DCP reads each rank's share of every tensor from whichever shards hold it.

Optimizer state comes from torch.distributed.checkpoint.state_dict (get/set_state_dict), except
under zero=1: shoal's ShardedAdamW (parallel/zero1.py) keeps each parameter's state on one
data-parallel rank only, which torch's state_dict helpers do not know. There, each rank saves (and
loads) the state of the parameters it owns, under the same names as a plain optimizer would; so a
zero=1 checkpoint loads into any layout and any layout's checkpoint loads into zero=1.

Non-tensor optimizer settings (param_groups: lr, betas, ...) are not saved: they come from the
config, and the learning rate is a function of the step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from shoal.model.transformer import param_name

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class _Stages(nn.Module):
    """A rank's several pipeline stages seen as one model, under the original parameter names."""

    def __init__(self, stages: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleDict()
        for stage in stages:
            for name, layer in stage.layers.items():
                self.layers[name] = layer
            for part in ("tok_embeddings", "norm", "output"):
                if getattr(stage, part, None) is not None:
                    setattr(self, part, getattr(stage, part))


def model_view(modules: list[nn.Module]) -> nn.Module:
    """One module whose parameters are this rank's share of the model (DDP unwrapped)."""
    plain = [m.module if isinstance(m, nn.parallel.DistributedDataParallel) else m for m in modules]
    return plain[0] if len(plain) == 1 else _Stages(plain)


def _is_zero1(optimizer) -> bool:
    from shoal.parallel.zero1 import ShardedAdamW

    return isinstance(optimizer, ShardedAdamW)


def _zero1_owned(view: nn.Module, optimizer) -> dict[str, nn.Parameter]:
    """The parameters whose optimizer state this rank holds under ZeRO-1, by name."""
    local = {id(p) for group in optimizer.optim.param_groups for p in group["params"]}
    return {param_name(n): p for n, p in view.named_parameters() if id(p) in local}


def rng_state(rank: int) -> dict[str, torch.Tensor]:
    state = {f"cpu.{rank}": torch.get_rng_state()}
    if torch.cuda.is_available():
        state[f"cuda.{rank}"] = torch.cuda.get_rng_state()
    return state


def capture(modules: list[nn.Module], optimizer, rank: int, compressor=None, diloco=None) -> dict:
    """This rank's share of the training state, as DCP saves it (references, not copies)."""
    view = model_view(modules)
    if _is_zero1(optimizer):
        model = get_model_state_dict(view, options=_OPTIONS)
        owned = _zero1_owned(view, optimizer)
        optim = {f"state.{name}.{k}": v
                 for name, p in owned.items() for k, v in optimizer.optim.state.get(p, {}).items()}
    else:
        model, optim = get_state_dict(view, optimizer, options=_OPTIONS)
        optim = {k: v for k, v in optim.items() if k.startswith("state.")}
    compress = {f"{rank}.{k}": v for k, v in compressor.state_dict().items()} if compressor is not None else {}
    out = {"model": model, "optim": optim, "rng": rng_state(rank), "compress": compress}
    if diloco is not None:  # outer state, and this replica group's own model and optimizer state
        out["diloco"] = diloco.capture(model, optim)
    return out


def load_targets(modules: list[nn.Module], optimizer, rank: int, saved_keys: dict[str, object],
                 compressor=None, diloco=None) -> dict:
    """Tensors shaped like this rank's share for DCP to fill in; `saved_keys` maps each key in the
    checkpoint to its TensorStorageMetadata (global size and dtype)."""
    view = model_view(modules)
    if _is_zero1(optimizer):
        model = get_model_state_dict(view, options=_OPTIONS)
        optim = {}
        for name, p in _zero1_owned(view, optimizer).items():
            prefix = f"optim.state.{name}."
            for key, meta in saved_keys.items():
                if key.startswith(prefix):
                    optim[key.removeprefix("optim.")] = torch.empty(meta.size, dtype=meta.properties.dtype,
                                                                   device=p.device)
    else:
        # A fresh optimizer has no state yet; get_state_dict creates it (one step with lr 0 and zero gradients).
        model, optim = get_state_dict(view, optimizer, options=_OPTIONS)
        optim = {k: v for k, v in optim.items() if k.startswith("state.")}
    rng = {}
    for kind in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        # A run resumed on more ranks than saved gives the new ranks rank 0's generator state.
        mine, first = f"rng.{kind}.{rank}", f"rng.{kind}.0"
        key = mine if mine in saved_keys else first if first in saved_keys else None
        if key:
            rng[key.removeprefix("rng.")] = torch.empty(saved_keys[key].size, dtype=torch.uint8)
    # Compression state exists once a step compressed; take what this rank saved, shaped as saved.
    mine = f"compress.{rank}."
    compress = {key.removeprefix("compress."): torch.empty(meta.size, dtype=meta.properties.dtype)
                for key, meta in saved_keys.items() if compressor is not None and key.startswith(mine)}
    out = {"model": model, "optim": optim, "rng": rng, "compress": compress}
    if diloco is not None:
        out["model"], out["optim"], out["diloco"] = diloco.load_targets(model, optim, saved_keys)
    return out


def apply(modules: list[nn.Module], optimizer, loaded: dict, compressor=None, diloco=None) -> None:
    """Put what DCP read into the model, the optimizer, the random-number generators and the
    gradient compressor."""
    view = model_view(modules)
    if diloco is not None:
        diloco.take_replica(loaded)
    if _is_zero1(optimizer):
        set_model_state_dict(view, loaded["model"], options=_OPTIONS)
        for name, p in _zero1_owned(view, optimizer).items():
            prefix = f"state.{name}."
            state = {k.removeprefix(prefix): v for k, v in loaded["optim"].items() if k.startswith(prefix)}
            if state:
                optimizer.optim.state[p] = state
    else:
        # set_state_dict needs the non-tensor param_groups too: take them from the live optimizer.
        _, current = get_state_dict(view, optimizer, options=_OPTIONS)
        groups = {k: v for k, v in current.items() if k.startswith("param_groups.")}
        set_state_dict(view, optimizer, model_state_dict=loaded["model"],
                       optim_state_dict={**loaded["optim"], **groups}, options=_OPTIONS)
    for key, value in loaded["rng"].items():
        if key.startswith("cpu."):
            torch.set_rng_state(value)
        elif key.startswith("cuda.") and torch.cuda.is_available():
            torch.cuda.set_rng_state(value)
    if compressor is not None and loaded.get("compress"):
        prefix = next(iter(loaded["compress"])).split(".")[0] + "."
        compressor.load_state_dict({k.removeprefix(prefix): v for k, v in loaded["compress"].items()})
    if diloco is not None:
        diloco.after_load(loaded)
