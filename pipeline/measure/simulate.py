"""A discrete-event Monte-Carlo simulation of a production run under interruptions: the
independent check of the closed form in `pipeline.measure.projection`.

It follows the run event by event (numpy, seeded): the first start; then for each checkpointed
segment, draw the time to the next interruption from an exponential distribution; if the
segment and its checkpoint finish first, move on; else lose the partial segment, pay a restart
(which an interruption can also cut short, and then starts over) and try the segment again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.measure.projection import RunModel, segments


@dataclass(frozen=True)
class SimResult:
    mean_wall_s: float
    stderr_s: float  # standard error of the mean
    mean_interruptions: float
    runs: int


def simulate(run: RunModel, interval_s: float, runs: int = 2000, seed: int = 0) -> SimResult:
    """Mean wall time over `runs` simulated runs (vectorised over runs, event by event)."""
    rng = np.random.default_rng(seed)
    lam = run.rate_per_s
    wall = np.full(runs, float(run.start_s))
    interruptions = np.zeros(runs)
    for work in segments(run.work_s, interval_s):
        need = work + run.ckpt_stall_s
        pending = np.ones(runs, dtype=bool)  # runs still trying to finish this segment
        while pending.any():
            idx = np.flatnonzero(pending)
            if lam == 0:
                wall[idx] += need
                break
            to_next = rng.exponential(1.0 / lam, size=idx.size)
            done = to_next >= need
            wall[idx[done]] += need
            pending[idx[done]] = False
            hit = idx[~done]
            wall[hit] += to_next[~done]  # the lost part of the segment
            interruptions[hit] += 1
            # the restart must itself run uninterrupted for restart_s
            restarting = hit
            while restarting.size:
                gap = rng.exponential(1.0 / lam, size=restarting.size)
                ok = gap >= run.restart_s
                wall[restarting[ok]] += run.restart_s
                wall[restarting[~ok]] += gap[~ok]
                interruptions[restarting[~ok]] += 1
                restarting = restarting[~ok]
    return SimResult(
        mean_wall_s=float(wall.mean()),
        stderr_s=float(wall.std(ddof=1) / np.sqrt(runs)) if runs > 1 else 0.0,
        mean_interruptions=float(interruptions.mean()),
        runs=runs,
    )
