"""The projection's band: every uncertain input varied over its own range, one at a time with
the others at their central values, and the changes in projected cost combined by root sum of
squares (first-order propagation, as the GUM combines independent contributions: JCGM 100:2008,
section 5.1). Each input's share of the band is its squared change over the sum of squares.
Pure functions.

Inputs (each a multiplier range on the central RunModel):
- throughput: the candidate's 95% interval of steady step time -> work_s scales with step time;
- ckpt_stall_s and restart_s: the lowest and highest its runs measured;
- the interruption rate: half to twice the assumed rate;
- scaling: efficiency at the target's GPU count from 1 (linear, the central value) down to an
  assumed floor (work_s / efficiency), since it is not measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from pipeline.measure.projection import RunModel, project

FIELDS = {
    "throughput": "work_s",
    "scaling": "work_s",
    "ckpt_stall_s": "ckpt_stall_s",
    "restart_s": "restart_s",
    "interruption_rate": "rate_per_gpu_hour",
}


@dataclass(frozen=True)
class Band:
    low: float
    mid: float
    high: float
    shares: dict[str, float]  # input -> share of the band's squared width, summing to 1 (or empty)
    swings: dict[str, tuple[float, float]]  # input -> (cost at its low end, cost at its high end)


def _cost(run: RunModel, price: float) -> float:
    c = project(run, price).cost_usd
    assert c is not None
    return c


def propagate(run: RunModel, price: float, ranges: Mapping[str, tuple[float, float]]) -> Band:
    """`ranges`: input name (FIELDS) -> (low, high) multipliers of that input's central value."""
    mid = _cost(run, price)
    down = up = 0.0
    squares: dict[str, float] = {}
    swings: dict[str, tuple[float, float]] = {}
    for name, (lo, hi) in ranges.items():
        if name not in FIELDS:
            raise ValueError(f"unknown band input '{name}' (one of {', '.join(FIELDS)})")
        if not (0 < lo <= 1 <= hi and math.isfinite(hi)):
            raise ValueError(f"{name}: multipliers must satisfy 0 < low <= 1 <= high, got ({lo}, {hi})")
        attr = FIELDS[name]
        ends = [_cost(replace(run, **{attr: getattr(run, attr) * m}), price) for m in (lo, hi)]
        swings[name] = (ends[0], ends[1])
        d_lo, d_hi = min(ends) - mid, max(ends) - mid
        down += min(d_lo, 0.0) ** 2
        up += max(d_hi, 0.0) ** 2
        squares[name] = max(abs(d_lo), abs(d_hi)) ** 2
    total = sum(squares.values())
    shares = {k: v / total for k, v in squares.items()} if total > 0 else {}
    return Band(mid - math.sqrt(down), mid, mid + math.sqrt(up), shares, swings)
