"""The rules of a run's observers ([metrics] and debug.profile_*): which library each metrics
backend needs and whether W&B can log in, and what the profiled steps and ranks mean. config.py
checks a job with them before any process starts; shoal/train/ (metric_backends.py, profiling.py)
acts on them. Torch-free."""

from __future__ import annotations

import re

from shoal.errors import UserError

METRICS_BACKENDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
"""metrics field -> (module it imports, shoal's pip extra)."""


def metrics_backend_problems(m) -> list[UserError]:
    """A metrics backend asked for whose library is not installed: caught before any process starts."""
    import importlib.util

    wanted = {"tensorboard": m.tensorboard, "wandb": bool(m.wandb)}
    found = [UserError(f"metrics.{name}", getattr(m, name), f"needs the {module} package: pip install "
                                                             f"'shoal[{extra}]' (or pip install {module})")
             for name, (module, extra) in METRICS_BACKENDS.items()
             if wanted[name] and importlib.util.find_spec(module) is None]
    if m.wandb == "online" and not _wandb_logged_in():  # W&B would stop rank 0 mid-start with a traceback
        found.append(UserError("metrics.wandb", m.wandb, "needs a W&B login: run `wandb login` or set WANDB_API_KEY, "
                                                         "or use metrics.wandb=offline (no account needed)"))
    return found


def _wandb_logged_in() -> bool:
    """Whether W&B has an API key: WANDB_API_KEY, or the netrc entry `wandb login` writes."""
    import netrc
    import os

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0].split(":")[0]
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


_DIGITS = re.compile("[0-9]{1,18}")


def profile_steps_problem(text: str) -> str | None:
    """Why `text` cannot be debug.profile_steps, or None."""
    if text.strip() == "" or profile_step_range(text) is not None:
        return None
    return "use a step or a range of optimizer steps `A-B` with 1 <= A <= B, e.g. 3-4 (or empty for none)"


def profile_step_range(text: str) -> tuple[int, int] | None:
    """debug.profile_steps as (first, last) step, both inclusive; None when it is empty or malformed."""
    first, _, last = text.strip().partition("-")
    last = last if _ else first
    if not (_DIGITS.fullmatch(first.strip()) and _DIGITS.fullmatch(last.strip())):
        return None
    a, b = int(first), int(last)
    return (a, b) if 1 <= a <= b else None


def profile_ranks(text: str) -> set[int] | None:
    """debug.profile_ranks as a set of ranks (None for `all` or a malformed list)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(_DIGITS.fullmatch(p) for p in parts):
        return None
    return {int(p) for p in parts}
