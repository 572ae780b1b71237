"""Time-to-train and cost, with the work expected to be lost to failures.

Failures: every GPU fails independently with mean time between failures `mtbf_gpu_hours`, so the
job (n GPUs, all needed) fails every mtbf_gpu_hours / n hours on average. Each failure throws away
the work since the last checkpoint (half an interval on average) and the restart time. Blocking
checkpoint writes add write/interval on top. The expected wall-clock is then

    ideal * (1 + write/interval) / (1 - (interval/2 + restart) / job_mtbf)

(first-order, valid while failures are rare within one interval). The default per-GPU MTBF,
50,000 hours, is what Llama 3 saw: 419 unexpected interruptions in 54 days on 16,384 H100s.
Young/Daly's optimal interval sqrt(2 * write * job_mtbf) is reported alongside.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

DEFAULT_MTBF_GPU_HOURS = 50_000.0


@dataclass(frozen=True)
class TrainingEstimate:
    tokens: float
    n_gpus: int
    tokens_per_s: float
    ideal_hours: float
    """Wall-clock with no failures and no checkpoint stalls."""
    usd_per_gpu_hour: float | None
    job_mtbf_hours: float
    """Mean time between failures of the whole job."""
    checkpoint_interval_hours: float
    restart_hours: float
    checkpoint_write_hours: float
    expected_hours: float
    """Wall-clock including expected lost work, restarts and checkpoint writes (inf: never finishes)."""
    expected_failures: float
    lost_hours: float
    """Expected wall-clock lost to failures (recomputed work plus restarts)."""
    optimal_interval_hours: float | None
    """Young/Daly checkpoint interval for this failure rate and write time."""

    @property
    def ideal_days(self) -> float:
        return self.ideal_hours / 24

    @property
    def expected_days(self) -> float:
        return self.expected_hours / 24

    @property
    def ideal_cost(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.ideal_hours * self.n_gpus * self.usd_per_gpu_hour

    @property
    def expected_cost(self) -> float | None:
        return None if self.usd_per_gpu_hour is None else self.expected_hours * self.n_gpus * self.usd_per_gpu_hour

    @property
    def goodput(self) -> float:
        """Fraction of the wall-clock that advances training."""
        return self.ideal_hours / self.expected_hours if math.isfinite(self.expected_hours) else 0.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(ideal_days=self.ideal_days, expected_days=self.expected_days, ideal_cost_usd=self.ideal_cost,
                   expected_cost_usd=self.expected_cost, goodput=self.goodput)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


def estimate(tokens: float, tokens_per_s: float, n_gpus: int, *, usd_per_gpu_hour: float | None = None,
             mtbf_gpu_hours: float = DEFAULT_MTBF_GPU_HOURS, checkpoint_interval_hours: float = 1.0,
             restart_hours: float = 0.25, checkpoint_write_hours: float = 0.0) -> TrainingEstimate:
    ideal = tokens / tokens_per_s / 3600.0
    job_mtbf = mtbf_gpu_hours / n_gpus
    loss_per_failure = checkpoint_interval_hours / 2 + restart_hours
    stall = 1 + checkpoint_write_hours / checkpoint_interval_hours
    denominator = 1 - loss_per_failure / job_mtbf
    expected = ideal * stall / denominator if denominator > 0 else math.inf
    failures = expected / job_mtbf if math.isfinite(expected) else math.inf
    optimal = math.sqrt(2 * checkpoint_write_hours * job_mtbf) if checkpoint_write_hours > 0 else None
    return TrainingEstimate(
        tokens=tokens, n_gpus=n_gpus, tokens_per_s=tokens_per_s, ideal_hours=ideal,
        usd_per_gpu_hour=usd_per_gpu_hour, job_mtbf_hours=job_mtbf,
        checkpoint_interval_hours=checkpoint_interval_hours, restart_hours=restart_hours,
        checkpoint_write_hours=checkpoint_write_hours, expected_hours=expected, expected_failures=failures,
        lost_hours=failures * loss_per_failure if math.isfinite(failures) else math.inf,
        optimal_interval_hours=optimal)
