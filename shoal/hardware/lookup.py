"""A device by the name a user gives it (`--gpu NAME`, `base = NAME` in a --hw-file): a catalog
entry, or this machine's measured `local` entry. Above both, so neither imports the other."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from shoal.errors import UserError
from shoal.files import read_toml
from shoal.hardware.catalog import ALIASES, CATALOG, GPU, lookup_gpu
from shoal.hardware.local import local_gpu
from shoal.hardware.overrides import apply_overrides


def known_names() -> list[str]:
    return [*CATALOG, "local"]


def get_gpu(name: str, *, remeasure: bool = False) -> GPU:
    """The catalog entry for `--gpu NAME` (aliases and case accepted); `local` is measured once and cached."""
    key = _catalog_key(name)
    if key == "local":
        return local_gpu(remeasure=remeasure)
    if key not in CATALOG:
        close = difflib.get_close_matches(key, [*CATALOG, *ALIASES, "local"], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError("gpu", name, f"{hint}known: {', '.join(known_names())} (or describe one with --hw-file)")
    return CATALOG[key]


def _catalog_key(name: str) -> str:
    """The catalog's key for a name as people write it: any case, spaces or underscores for dashes, an alias, a
    DGX or HGX system's name, or a device name as torch.cuda.get_device_name() and nvidia-smi print it ("NVIDIA
    H100 80GB HBM3", "A100-SXM4-40GB": catalog.lookup_gpu, which maps only the variants with the entry's peak)."""
    key = re.sub(r"[\s_]+", "-", name.strip().lower()).removeprefix("nvidia-")
    key = re.sub(r"^(dgx|hgx)-", "", key)  # a system's name for its GPUs (Megatron-Bridge's tables: DGX-GB200)
    key = ALIASES.get(key, key)
    if key in CATALOG or key == "local":
        return key
    device = lookup_gpu(key)
    if device is None:
        return key
    return "a100-40gb" if device.name == "a100-80gb" and "40gb" in key else device.name


def load_hw_file(path: str | os.PathLike, default_base: str | None) -> GPU:
    """A TOML file of GPU fields; `base = "h100-sxm"` (or --gpu) supplies the ones it leaves out."""
    data = read_toml("hw_file", path, "a TOML file of hardware fields")
    base_name = data.pop("base", default_base)
    if base_name is None:
        raise UserError("hw_file", str(path), "name a base entry (base = \"h100-sxm\") or pass --gpu")
    base = get_gpu(str(base_name))
    data.setdefault("name", f"{base.name}+{Path(path).stem}")
    return apply_overrides(base, data, source="hw_file")
