"""A device by its name: the name a user gives it (`--gpu NAME`, `base = NAME` in a --hw-file), a catalog
entry or this machine's measured `local` entry, and the name torch gives a CUDA device (lookup_gpu, which the
trainer's MFU and --validate use). Above both, so neither imports the other."""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from shoal.errors import UserError
from shoal.files import read_toml
from shoal.hardware.catalog import CATALOG
from shoal.hardware.gpu import GPU
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
    H100 80GB HBM3", "A100-SXM4-40GB": lookup_gpu below, which maps only the variants with the entry's peak)."""
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
    base_name = data.pop("base", None)
    if base_name is not None and not isinstance(base_name, str):  # base = ["h100"] read as h100 by the device patterns
        raise UserError("hw_file.base", base_name, "must be an entry's name, e.g. base = \"h100-sxm\"")
    if base_name is not None and default_base is not None and _catalog_key(default_base) != _catalog_key(base_name):
        # --gpu a100 beside base = "h100-sxm" planned an H100 without a word: the flag typed was dropped
        raise UserError("--gpu", default_base, f"is another device than the base = {base_name!r} of {path}; drop "
                                               "--gpu (the file's base is used) or make the two agree")
    base_name = base_name if base_name is not None else default_base
    if base_name is None:
        raise UserError("hw_file", str(path), "name a base entry (base = \"h100-sxm\") or pass --gpu")
    base = get_gpu(base_name)
    data.setdefault("name", f"{base.name}+{Path(path).stem}")
    return apply_overrides(base, data, source="hw_file")


ALIASES = {
    "a100": "a100-80gb", "a100-sxm": "a100-80gb", "a100-80g": "a100-80gb", "a100-40g": "a100-40gb",
    "h800-sxm": "h800",
    "h100": "h100-sxm", "h100-80gb": "h100-sxm",
    "h200-sxm": "h200", "b200-sxm": "b200", "mi300": "mi300x",
    "v100-sxm2": "v100", "v100-32gb": "v100", "v100-sxm2-32gb": "v100", "mi250x-gcd": "mi250x", "tpu": "tpu-v5p", "v5p": "tpu-v5p",
    "gb200-nvl72": "gb200", "gb300-nvl72": "gb300", "v5e": "tpu-v5e", "tpu-v5-lite": "tpu-v5e", "v6e": "tpu-v6e",
    "trillium": "tpu-v6e", "tpu-trillium": "tpu-v6e", "mi325": "mi325x", "v3": "tpu-v3", "v4": "tpu-v4",
    "a800-80gb": "a800", "a800-sxm": "a800", "a800-sxm4-80gb": "a800",
    "h100-pcie-80gb": "h100-pcie", "h100-nvl-94gb": "h100-nvl", "h20-96gb": "h20", "l40s-48gb": "l40s",
    "mi355": "mi355x", "mi350": "mi350x", "gaudi-2": "gaudi2", "hl-225": "gaudi2", "gaudi-3": "gaudi3",
    "hl-325l": "gaudi3", "v7": "tpu-v7", "v7x": "tpu-v7", "tpu7x": "tpu-v7", "tpu-v7x": "tpu-v7",
    "ironwood": "tpu-v7", "tpu-ironwood": "tpu-v7", "v100-sxm2-16gb": "v100-16gb",
}

# torch.cuda.get_device_name() -> catalog key. Only variants whose dense BF16 peak equals the entry's
# are mapped (an H100 PCIe or NVL has a different peak, so it maps to nothing rather than a wrong MFU).
_DEVICE_PATTERNS = [
    (re.compile(r"\bgh200\b|\bh200\b"), "h200"),
    (re.compile(r"\bh100\b(?!.*(pcie|nvl))"), "h100-sxm"),
    (re.compile(r"\bh100\b.*\bpcie\b"), "h100-pcie"),
    (re.compile(r"\bh100\b.*\bnvl\b"), "h100-nvl"),
    (re.compile(r"\bh20\b"), "h20"),
    (re.compile(r"\bl40s\b"), "l40s"),
    (re.compile(r"\ba100\b"), "a100-80gb"),  # every A100 (SXM or PCIe, 40 or 80 GB) peaks at 312 TFLOP/s
    (re.compile(r"\ba800\b(?!.*40gb)"), "a800"),
    (re.compile(r"\bh800\b(?!.*pcie)"), "h800"),
    (re.compile(r"\bb200\b"), "b200"),
    (re.compile(r"\bmi300x\b"), "mi300x"),
    (re.compile(r"\bmi355x\b"), "mi355x"),
    (re.compile(r"\bmi350x\b"), "mi350x"),
    (re.compile(r"\bmi250x\b"), "mi250x"),  # not MI250 (362 TFLOP/s per package)
    (re.compile(r"\bv100 sxm2 16gb\b"), "v100-16gb"),
    (re.compile(r"\bv100 sxm2\b"), "v100"),  # PCIe V100s peak at 112 TFLOP/s: not mapped
]


def lookup_gpu(device_name: str) -> GPU | None:
    """Map a CUDA device name ("NVIDIA H100 80GB HBM3") to its catalog entry, or None if unknown.

    The trainer uses `entry.peak_bf16_flops` as its MFU denominator.
    """
    name = device_name.lower().replace("-", " ")
    for pattern, key in _DEVICE_PATTERNS:
        if pattern.search(name):
            return CATALOG[key]
    return None
