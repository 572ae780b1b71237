"""The planner's prediction for a finished run's own layout, beside what the run measured.

The run stored it before its first step (run.json's `prediction`, shoal/planner/prediction.py); a
run from before shoal stored predictions is planned here instead, and the report says so. That
fallback predicts memory always (it needs only the device's reserved bytes) and step time where
the planner knows the hardware: a catalog GPU by its CUDA name, or this machine's `local` profile
once it has been measured (a report never starts a benchmark).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass
class ReportPrediction:
    pred: object
    """shoal.planner.prediction.RunPrediction (memory, step time, MFU against the run's own peak)."""
    source: str
    """'' when the run stored it; else a note saying it was planned now."""


def predict(info: dict, measured: dict | None = None) -> ReportPrediction:
    """The run's prediction; `measured` (step_time_s, mfu) puts a re-planned step's MFU on the run's peak."""
    from shoal.planner.prediction import from_run_info, replan_run_info

    stored = from_run_info(info)
    if stored is not None:
        return ReportPrediction(stored, "")
    pred = replan_run_info(info)
    if measured:  # the measured MFU's peak is not in run.json
        pred = replace(pred, mfu=pred.on_measured_peak(measured["step_time_s"], measured.get("mfu")))
    return ReportPrediction(pred, "this run stored no prediction (an older shoal): planned now")
