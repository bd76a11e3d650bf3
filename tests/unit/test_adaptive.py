"""Adaptive qualification against the full grid on seeded simulated sweeps with known truth."""

from __future__ import annotations

import numpy as np

from pipeline.measure.adaptive import adaptive
from tests.support.adaptive_sim import run


def test_adaptive_picks_the_full_grids_winner_with_fewer_gpu_hours() -> None:
    r = run(100)
    assert r["same"] >= 0.95 and r["true"] >= 0.95
    assert r["hours_adaptive"] <= 0.60 * r["hours_full"]  # at least 40% fewer


def test_close_candidates_get_more_rounds_than_clear_ones() -> None:
    rng = np.random.default_rng(3)
    clear = [adaptive((1.0, 2.0), 0.10, 30, 5, rng).rounds for _ in range(20)]
    close = [adaptive((1.0, 1.03), 0.10, 30, 5, rng).rounds for _ in range(20)]
    assert max(clear) == 1  # separated after the first round
    assert sum(close) / 20 > 2
