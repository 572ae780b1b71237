"""Find the line of code that issued a collective.

A collective is reached through layers: user code -> maybe a torch library (FSDP, pipelining,
DTensor) -> the torch.distributed API function -> our wrapper. The report wants the first frame
outside torch, shoal.debug and shoal.comm.patch ("site"), the public API name (`all_reduce`), and when a
torch library sat in between, where in that library ("via").
"""

from __future__ import annotations

import os
import sys

import torch

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_SELF_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_PATCH_FILE = os.path.join(os.path.dirname(_SELF_DIR.rstrip(os.sep)), "comm", "patch.py")  # the wrappers
_C10D_FILES = {os.path.join(_TORCH_DIR, "distributed", "distributed_c10d.py")}
# Decorators and context managers that wrap API functions; never a call site.
_PLUMBING = ("typing_extensions.py", os.sep + "contextlib.py", os.sep + "functools.py", os.sep + "warnings.py")
_CWD = os.getcwd() + os.sep

_site_cache: dict[tuple, str] = {}


def short_path(path: str) -> str:
    """Relative to the working directory when inside it; torch files as `torch/...`."""
    if path.startswith(_TORCH_DIR):
        return "torch/" + path[len(_TORCH_DIR):]
    if path.startswith(_CWD):
        return path[len(_CWD):]
    return path


def _fmt(code, lineno: int) -> str:
    key = (code, lineno)
    s = _site_cache.get(key)
    if s is None:
        s = _site_cache[key] = f"{short_path(code.co_filename)}:{lineno} in {code.co_name}"
    return s


def find() -> tuple[str | None, str | None, str | None]:
    """(site, api, via) for the collective being issued by the caller's caller (ours are skipped)."""
    f = sys._getframe(1)
    api = via = None
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(_SELF_DIR) or fn == _PATCH_FILE or fn.endswith(_PLUMBING):
            pass
        elif fn.startswith(_TORCH_DIR):
            if fn in _C10D_FILES:
                api, via = f.f_code.co_name, None  # the outermost API frame wins
            elif via is None and "c10d_logger" not in fn:
                via = _fmt(f.f_code, f.f_lineno)
        else:
            return _fmt(f.f_code, f.f_lineno), api, via
        f = f.f_back
    return None, api, via  # called from a thread with no user frame (e.g. the CUDA autograd engine)
