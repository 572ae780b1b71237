"""Energy and carbon of a training run, and when to start a deferrable one.

Energy = GPUs x board power x wall-clock hours x PUE. Training holds GPUs at their power limit (the
catalog's power_watts, the TDP; hardware.py cites them), and the data centre's power usage
effectiveness (PUE) adds cooling and distribution. Hosts, NICs and switches are not counted: on a
DGX H100 they add roughly 0.4 of the GPUs' power (10.2 kW system maximum for 8 x 700 W GPUs, NVIDIA's
DGX H100 datasheet), so this is a lower bound; raise power_watts with --hw to include them.

CO2 = energy x the grid's carbon intensity: a region's annual average from GRID_INTENSITY, or a
user's hourly series (--carbon-trace) from which the start hour with the least emissions is chosen.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from shoal.errors import UserError

DEFAULT_PUE = 1.2
"""An assumption between the two sourced ends: Google's fleet-wide trailing PUE, 1.10 (Google 2023
Environmental Report), and the industry average, 1.58 (Uptime Institute Global Data Center Survey 2023).
Set --pue for your site."""

GRID_INTENSITY = {
    # gCO2 per kWh generated, annual averages for 2023, rounded; Ember, "Global Electricity Review 2024"
    # and its yearly electricity data (direct combustion emissions, not life-cycle). APPROXIMATE: read
    # from those publications from memory, good to about +-10%; pass your provider's number when it matters.
    "world": 480,
    "us": 370,
    "eu": 245,
    "france": 56,
    "germany": 380,
    "uk": 240,
    "sweden": 40,
    "norway": 30,
    "poland": 660,
    "china": 580,
    "india": 710,
    "japan": 480,
    "canada": 130,
}
"""Region -> grams of CO2 per kWh (see the comment above for the source)."""


@dataclass(frozen=True)
class Energy:
    kwh: float
    """Energy drawn from the grid over the run, kWh (PUE included)."""
    pue: float
    gpu_power_watts: float
    hours: float
    """Wall-clock hours the energy is for."""
    region: str | None
    grams_per_kwh: float | None
    """The region's average intensity, or the trace's mean over the chosen window."""

    @property
    def co2_kg(self) -> float | None:
        return None if self.grams_per_kwh is None else self.kwh * self.grams_per_kwh / 1000


MAX_PUE = 5.0
"""A bound for unit mistakes, not a measured limit: the figures above are 1.10 to 1.58, so a PUE
past 5 is a percentage (120) or a typo, not a site."""


def check_pue(pue: float) -> float:
    if not math.isfinite(pue) or not 1 <= pue <= MAX_PUE:
        raise UserError("pue", pue, f"power usage effectiveness is facility power / IT power, at least 1.0 "
                                    f"and at most {MAX_PUE:g} (e.g. 1.2)")
    return pue


def region_intensity(region: str) -> float:
    key = region.strip().lower()
    if key not in GRID_INTENSITY:
        import difflib

        close = difflib.get_close_matches(key, GRID_INTENSITY, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError("region", region, f"{hint}known: {', '.join(GRID_INTENSITY)} (or give an hourly --carbon-trace)")
    return float(GRID_INTENSITY[key])


def energy(n_gpus: int, gpu_power_watts: float, hours: float, *, pue: float = DEFAULT_PUE,
           region: str | None = None) -> Energy:
    kwh = n_gpus * gpu_power_watts * hours * check_pue(pue) / 1000
    return Energy(kwh, pue, gpu_power_watts, hours, region, region_intensity(region) if region else None)


# --- carbon-aware start: an hourly intensity series ---


@dataclass(frozen=True)
class Trace:
    labels: list[str]
    """The first column of each row (a timestamp), as written."""
    grams_per_kwh: list[float]
    """Hourly carbon intensity, gCO2/kWh."""


MAX_GRAMS_PER_KWH = 5000.0
"""No grid is dirtier than its dirtiest plant (lignite ~1100 gCO2/kWh, IPCC AR5 WG3 Annex III); a
value past this is a unit mistake (kg, or g/MWh), not a reading."""


def read_trace(path: str | Path) -> Trace:
    """A CSV of hourly intensities: `time,gco2_per_kwh` per line (a header line is allowed).

    The second column is the intensity; the first names the hour (kept as written for the output)."""
    from shoal.files import read_input_file  # the one check of a file a command reads

    give = "a CSV of 'time,gco2_per_kwh' lines"
    try:
        text = read_input_file("carbon_trace", path, give).decode()
    except UnicodeDecodeError:
        raise UserError("carbon_trace", str(path), f"is not UTF-8 text; give {give}") from None
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as e:  # a field past csv's limit (131072 characters): some other file
        raise UserError("carbon_trace", str(path), f"is not a CSV of hourly values ({e}); give {give}") from None
    labels, values = [], []
    for i, row in enumerate(rows, 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 2:
            raise UserError("carbon_trace", str(path), f"line {i}: expected 'time,gco2_per_kwh', got {','.join(row)!r}")
        try:
            value = float(row[1])
        except ValueError:
            if not values and not labels:
                continue  # the header
            raise UserError("carbon_trace", str(path), f"line {i}: {row[1].strip()!r} is not a number of gCO2/kWh") from None
        if not 0 <= value <= MAX_GRAMS_PER_KWH:  # nan fails too
            raise UserError("carbon_trace", str(path), f"line {i}: intensity {value} must be from 0 to "
                                                       f"{MAX_GRAMS_PER_KWH:g} gCO2/kWh (coal is about 1000)")
        labels.append(row[0].strip())  # labels may repeat: a trace of several days named by hour of day
        values.append(value)
    if not values:
        raise UserError("carbon_trace", str(path), "no hourly values found (write lines like 2025-01-01T00:00,312)")
    return Trace(labels, values)


@dataclass(frozen=True)
class Window:
    start_index: int
    """Hour of the trace the run should start at (0 = its first row)."""
    start_label: str
    hours: float
    grams_per_kwh: float
    """Mean intensity over the run when started then, weighted by the hours it runs in each."""
    now_grams_per_kwh: float
    """The same if started at the trace's first hour."""

    @property
    def saving(self) -> float:
        """Fraction of the emissions saved against starting at once."""
        return 1 - self.grams_per_kwh / self.now_grams_per_kwh if self.now_grams_per_kwh > 0 else 0.0


def _mean_over(values: list[float], prefix: list[float], start: int, hours: float) -> float:
    """Mean of an hourly series over [start, start + hours), wrapping around (a repeating series).
    `prefix[i]` is sum(values[:i]), so each start costs O(1) however long the run."""
    n, whole, frac = len(values), int(hours), hours - int(hours)

    def summed(a: int, count: int) -> float:  # sum of `count` hours from hour a, wrapping
        cycles, rest = divmod(count, n)
        end = a + rest
        part = prefix[end] - prefix[a] if end <= n else prefix[n] - prefix[a] + prefix[end - n]
        return cycles * prefix[n] + part

    return (summed(start, whole) + frac * values[(start + whole) % n]) / hours


def best_start(trace: Trace, hours: float, *, latest_start: int | None = None) -> Window | None:
    """The start hour whose run (of `hours`) has the lowest mean intensity. Starts range over the trace
    (or up to `latest_start`); a run longer than what follows its start wraps around, treating the
    trace as a repeating pattern (a typical day or week). None for a run that never ends."""
    assert hours > 0
    if not math.isfinite(hours):
        return None
    values = trace.grams_per_kwh
    last = len(values) - 1 if latest_start is None else min(latest_start, len(values) - 1)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    means = [_mean_over(values, prefix, s, hours) for s in range(last + 1)]
    best = min(range(len(means)), key=lambda s: (round(means[s], 9), s))  # the earliest of equal windows
    return Window(best, trace.labels[best], hours, means[best], means[0])


def run_energy(est, cluster, *, pue: float = DEFAULT_PUE, region: str | None = None,
               trace: Trace | None = None) -> Energy | None:
    """Energy (and CO2 where a region or a trace says how clean the grid is) of a run whose time-to-train
    is `est` (cost.TrainingEstimate) on `cluster`; None for a device without a power figure. The hours
    are the expected wall-clock, failures included (lost work burns energy too), or the ideal one when
    the run never finishes; with a trace, the intensity of the best start window for those hours."""
    watts = cluster.gpu.board_watts
    if not watts:
        return None
    hours = est.expected_hours if math.isfinite(est.expected_hours) else est.ideal_hours
    used = energy(cluster.n_gpus, watts, hours, pue=pue, region=region)
    window = best_start(trace, hours) if trace is not None else None
    if window is not None:
        used = replace(used, grams_per_kwh=window.grams_per_kwh)
    return used
