"""The projection's band against hand computations: one input alone gives exactly the
projection at its ends; two combine by root sum of squares; shares are squared swings."""

from __future__ import annotations

import math

import pytest

from pipeline.measure.band import propagate
from pipeline.measure.projection import RunModel, project

RUN = RunModel(
    work_s=100 * 3600.0, gpus=64, rate_per_gpu_hour=2e-5, ckpt_stall_s=20.0, restart_s=120.0, start_s=60.0
)
PRICE = 3.0


def cost(**change: float) -> float:
    c = project(RunModel(**{**RUN.__dict__, **change}), PRICE).cost_usd
    assert c is not None
    return c


def test_one_input_alone_gives_the_projection_at_its_ends() -> None:
    b = propagate(RUN, PRICE, {"interruption_rate": (0.5, 2.0)})
    assert b.mid == pytest.approx(cost())
    assert b.low == pytest.approx(cost(rate_per_gpu_hour=1e-5))
    assert b.high == pytest.approx(cost(rate_per_gpu_hour=4e-5))
    assert b.shares == {"interruption_rate": 1.0}


def test_throughput_and_scaling_combine_by_root_sum_of_squares() -> None:
    b = propagate(RUN, PRICE, {"throughput": (0.95, 1.05), "scaling": (1.0, 1.25)})
    d_thr_hi = cost(work_s=RUN.work_s * 1.05) - cost()
    d_thr_lo = cost() - cost(work_s=RUN.work_s * 0.95)
    d_scale = cost(work_s=RUN.work_s * 1.25) - cost()
    assert b.high - b.mid == pytest.approx(math.hypot(d_thr_hi, d_scale))
    assert b.mid - b.low == pytest.approx(d_thr_lo)  # scaling only raises the cost
    total = max(d_thr_hi, d_thr_lo) ** 2 + d_scale**2
    assert b.shares["scaling"] == pytest.approx(d_scale**2 / total)
    assert sum(b.shares.values()) == pytest.approx(1.0)


def test_an_input_that_does_not_vary_has_no_share_and_bad_ranges_are_refused() -> None:
    b = propagate(RUN, PRICE, {"restart_s": (1.0, 1.0), "ckpt_stall_s": (0.5, 1.5)})
    assert b.shares["restart_s"] == 0.0 and b.shares["ckpt_stall_s"] == 1.0
    with pytest.raises(ValueError, match="low <= 1 <= high"):
        propagate(RUN, PRICE, {"throughput": (1.1, 1.2)})
    with pytest.raises(ValueError, match="unknown band input"):
        propagate(RUN, PRICE, {"gpus": (0.5, 2.0)})
