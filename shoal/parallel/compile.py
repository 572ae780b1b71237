"""torch.compile, one transformer block at a time (`train.compile = true`).

The block is the unit activation checkpointing and FSDP already wrap, and every block has the same
code, so one compilation serves them all (dynamo guards on the code, the block's parameters are
graph inputs); a whole-model graph would also have to span FSDP's per-block gathers and the
pipeline's stage boundaries. Each block is compiled in place (`Module.compile`), so parameter
names, state dicts and checkpoints stay those of the plain model.

Backend: inductor (Triton kernels on CUDA, C++/OpenMP on CPU, which needs a C++ compiler). On CPU
the first step pays the compilation: 5-10 s for the tiny model's block forward and backward on
this repo's 2-core machine with an empty inductor cache (51 s the first time ever, when inductor
also builds its C++ headers); later runs reuse the kernels from torch's on-disk cache.
"""

from __future__ import annotations

import os
import shutil
import sys

import torch
from torch import nn

from shoal.errors import UserError


def check_compiler(device_type: str) -> None:
    """inductor's CPU backend builds C++ with $CXX, else g++ (clang++ on macOS), and tries no other
    name (torch._inductor.config.cpp.cxx): refuse train.compile without it. `shoal train` asks before
    it starts any worker, apply_compile again in each."""
    cxx = os.environ.get("CXX", "clang++" if sys.platform == "darwin" else "g++")
    if device_type == "cpu" and not shutil.which(cxx):
        raise UserError("train.compile", True, f"inductor's CPU backend needs a C++ compiler and {cxx} is not on "
                                               "PATH; install g++ (or point $CXX at one) or set train.compile=false")


def apply_compile(model: nn.Module, enabled: bool, tensor_parallel: bool = False, device_type: str = "cpu") -> None:
    """Compile each block of `model` (a whole model or one pipeline stage) in place.

    tensor_parallel: compile each block's attention and feed-forward instead of the whole block.
    A compiled whole block under the TP plan (torch 2.13) hands a plain-tensor gradient back to the
    embedding's DTensor redistribute, which fails in backward ("'Tensor' object has no attribute
    '_local_tensor'", with aot_eager too); the two sublayers compile and match eager.
    """
    if not enabled:
        return
    check_compiler(device_type)
    # Compilations allowed per code before dynamo falls back to eager (default 8): training and
    # evaluation (no grad) graphs, a short last micro-batch, dynamic-shape variants each take one.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    for block in model.layers.values():
        for unit in (block.attention, block.feed_forward) if tensor_parallel else (block,):
            unit.compile()
