"""The dtype a run computes in, and the parts of the model that compute in at least fp32, whatever
their inputs are.

Norms, rotary embeddings, the router's softmax and the loss upcast bf16 inputs (under autocast) to
fp32, as Llama does. Wider inputs keep their precision: `shoal verify` runs the model in float64
(shoal/train/parity.py says why), and a cast down to fp32 there would bring back the rounding noise
float64 is there to remove.
"""

from __future__ import annotations

import torch


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or in its own dtype when that is wider (float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def compute_dtype(precision: str) -> torch.dtype:
    """What train.precision computes in under autocast: float16 for fp16, bfloat16 for bf16,
    bf16-params and fp8 (whose linear layers cast further, parallel/float8.py), and the default dtype
    (no autocast) for fp32."""
    return {"fp32": torch.get_default_dtype(), "fp16": torch.float16}.get(precision, torch.bfloat16)
