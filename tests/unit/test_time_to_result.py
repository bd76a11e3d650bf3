"""Time to result (pipeline.measure.projection): the queue before the production run and between
its chained jobs, against hand computations and a job-by-job walk."""

from __future__ import annotations

import math

import pytest

from pipeline.measure.projection import (
    QueueModel,
    TimeToResult,
    chained_jobs,
    time_to_result,
    time_to_result_band,
)

H = 3600.0


def _walk(wall_s: float, restart_s: float, max_job_s: float) -> int:
    """Jobs one after another: the first trains for MaxTime, each later one restarts first."""
    left, jobs = wall_s - max_job_s, 1
    while left > 0:
        jobs += 1
        left -= max_job_s - restart_s
    return jobs


@pytest.mark.parametrize(
    ("wall_h", "restart_s", "max_h"),
    [(10, 300, 48), (48, 300, 48), (48.01, 300, 48), (100, 600, 24), (1000, 60, 2), (7.5, 1799, 0.5)],
)
def test_chained_jobs_match_a_job_by_job_walk(wall_h: float, restart_s: float, max_h: float) -> None:
    assert chained_jobs(wall_h * H, restart_s, max_h * H) == _walk(wall_h * H, restart_s, max_h * H)


def test_no_limit_is_one_job_and_a_restart_longer_than_the_limit_is_none() -> None:
    assert chained_jobs(1e9, 300, None) == 1
    assert chained_jobs(10 * H, H, H) is None


def test_time_to_result_by_hand() -> None:
    """100 h of projected wall time on a partition with MaxTime 48 h: jobs of 48 h, then
    47.9 h of training after a 6-minute restart each -> 3 jobs (48 + 47.9 = 95.9 < 100).
    Waits: 2 h for the first (the scheduler's estimate), 30 min for each later one."""
    q = QueueModel(first_wait_s=2 * H, later_wait_s=(0.1 * H, 0.5 * H, 3 * H), max_job_s=48 * H)
    t = time_to_result(100 * H, 360, q, q.later_wait_s[1])
    assert t == TimeToResult(
        jobs=3, wait_s=2 * H + 2 * 0.5 * H, compute_s=100 * H + 2 * 360, total_s=pytest.approx(103.2 * H)
    )
    assert t.total_s == pytest.approx(3 * H + 100 * H + 720)


def test_the_band_pairs_wall_times_with_waits_low_to_high() -> None:
    q = QueueModel(first_wait_s=600, later_wait_s=(60, 120, 900), max_job_s=10 * H)
    low, mid, high = time_to_result_band((9 * H, 12 * H, 30 * H), 300, q)
    assert (low.jobs, mid.jobs, high.jobs) == (1, 2, 4)
    assert low.total_s == 600 + 9 * H
    assert mid.total_s == 600 + 120 + 12 * H + 300
    assert high.total_s == 600 + 3 * 900 + 30 * H + 3 * 300
    assert low.total_s <= mid.total_s <= high.total_s


def test_a_run_that_never_ends_has_no_finite_time_to_result() -> None:
    q = QueueModel(first_wait_s=0, later_wait_s=(0, 0, 0), max_job_s=None)
    assert math.isinf(time_to_result(math.inf, 300, q, 0).total_s)
    assert math.isinf(time_to_result(10 * H, 2 * H, QueueModel(0, (0, 0, 0), H), 0).total_s)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"first_wait_s": -1, "later_wait_s": (0, 0, 0)},
        {"first_wait_s": math.nan, "later_wait_s": (0, 0, 0)},
        {"first_wait_s": 0, "later_wait_s": (5, 1, 9)},
        {"first_wait_s": 0, "later_wait_s": (0, 0, 0), "max_job_s": 0},
    ],
)
def test_bad_queue_figures_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        QueueModel(**kwargs)
