"""Step-time statistics: percentiles and the coefficient of variation of the timed steps.
Pure functions."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepStats:
    p50_s: float
    p95_s: float
    cv: float | None  # coefficient of variation: stdev / mean; None with one timed step
    timed_steps: int
    excluded_steps: int


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def step_stats(step_times: Sequence[float], warmup: int) -> StepStats | None:
    """Statistics of the steps after warm-up; None when no step is left to time."""
    timed = list(step_times[warmup:])
    if not timed:
        return None
    mean = statistics.fmean(timed)
    # one step has no spread to measure: the CV is not defined (None), not 0
    cv = statistics.pstdev(timed) / mean if len(timed) > 1 and mean > 0 else None
    return StepStats(
        percentile(timed, 50), percentile(timed, 95), cv, len(timed), min(warmup, len(step_times))
    )
