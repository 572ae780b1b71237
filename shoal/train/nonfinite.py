"""The NaN/Inf guard: a step whose loss or gradient norm is not finite never reaches the weights on disk.

One NaN update poisons every weight it touches, and each later checkpoint and the exported model
would carry it. The guard looks at the step's global loss and global gradient norm after backward
and before the optimizer step. Both numbers are already the same on every rank (the loss is
all-reduced, the norm is global), so every rank takes the same decision and none is left waiting
in a collective.

train.on_nonfinite = "stop": raise NonFiniteStep (its one line is printed, exit code NONFINITE, 3); the
    save in flight, of an earlier good step, is finished first; nothing of this step is saved.
train.on_nonfinite = "skip": drop this step's update (its gradients are zeroed as every step's are)
    and go on; each skip is reported with the running count.

An update can itself leave the weights non-finite from a finite loss and gradient (an lr or weight
decay large enough to overflow float32). The next step's loss shows it; before a checkpoint the
weights themselves are checked, and after the last step the held-out loss shows it: either stops the
run under either policy (the update cannot be dropped any more) before it is logged, saved or written
to model/.
"""

from __future__ import annotations

import math
import sys
from typing import Callable

class NonFiniteStep(Exception):
    """A non-finite loss or gradient norm stopped the run."""


class NonFiniteGuard:
    def __init__(self, policy: str, before_stop: Callable[[], None] = lambda: None, report: bool = True):
        assert policy in ("stop", "skip"), policy  # validated in config.py
        self.policy, self.before_stop, self.report, self.skipped = policy, before_stop, report, 0

    def allows_update(self, step: int, loss: float, grad_norm: float) -> bool:
        """True when step `step` (1-based) may update the weights; False: skip it; raises to stop."""
        bad = [f"{name} is {value}" for name, value in (("loss", loss), ("grad norm", grad_norm))
               if not math.isfinite(value)]
        if not bad:
            return True
        what = " and ".join(bad)
        if self.policy == "skip":
            self.skipped += 1
            if self.report:
                print(f"shoal: step {step}: {what}; update skipped ({self.skipped} so far, train.on_nonfinite=skip)",
                      file=sys.stderr, flush=True)
            return False
        self.before_stop()
        raise NonFiniteStep(f"step {step}: {what}; stopping before it reaches a checkpoint (the ones already "
                            "saved are intact; no model/ written); lower train.lr or check the model.* settings, "
                            "or --set train.on_nonfinite=skip to drop such steps")

    def check_eval(self, step: int, eval_loss: float) -> None:
        """Raise when the held-out loss after step `step`'s update is not finite (the same on every rank)."""
        if math.isfinite(eval_loss):
            return
        self.before_stop()
        raise NonFiniteStep(f"step {step}: eval loss is {eval_loss} after the update, so the weights are no longer "
                            "finite; stopping before they reach a checkpoint (no model/ written); lower train.lr "
                            "or train.weight_decay")

    def check_weights(self, step: int, params, rt) -> None:
        """Before a checkpoint of step `step`: raise when its update left a weight non-finite on any rank.
        One flag per tensor and one all-reduce for them all, on save steps only."""
        import torch

        flags = [torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all() for p in params]
        bad = (~torch.stack(flags)).any() if flags else torch.zeros((), dtype=torch.bool)
        if rt.global_mean(bad) == 0:  # a sum over the world: nonzero when any rank saw one
            return
        self.before_stop()
        raise NonFiniteStep(f"step {step}: the update left weights that are not finite (loss and gradient were); "
                            "stopping before they reach a checkpoint (the ones already saved are intact; no model/ "
                            "written); lower train.lr or train.weight_decay")
