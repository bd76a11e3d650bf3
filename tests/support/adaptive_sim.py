"""Adaptive qualification against the full grid on seeded simulated sweeps with known truth,
shared by tests/unit/test_adaptive.py (its bounds) and benchmarks/bench_adaptive.py (its
figures): six candidates of known mean step time and step-time noise."""

from __future__ import annotations

import numpy as np

from pipeline.measure.adaptive import adaptive, full_grid

MEANS = (1.0, 1.06, 1.12, 1.25, 1.5, 2.0)  # seconds per step: the best 6% ahead of the next
CV, STEPS, REPEATS = 0.10, 30, 5


def run(sweeps: int, seed: int = 26) -> dict[str, float]:
    """How often the adaptive mode picks the full grid's winner (`same`) and the true best
    (`true`) over `sweeps` seeded sweeps, and the GPU-hours each spent."""
    rng = np.random.default_rng(seed)
    same = true = 0
    hours_a = hours_f = 0.0
    for _ in range(sweeps):
        f = full_grid(MEANS, CV, STEPS, REPEATS, rng)
        a = adaptive(MEANS, CV, STEPS, REPEATS, rng)
        same += a.winner == f.winner
        true += a.winner == 0
        hours_a += a.gpu_hours
        hours_f += f.gpu_hours
    return {"same": same / sweeps, "true": true / sweeps, "hours_adaptive": hours_a, "hours_full": hours_f}
