"""The projection's closed form against hand computations and against an independent
event-by-event simulation of the same run."""

from __future__ import annotations

import math

import pytest

from pipeline.measure.projection import (
    DEFAULT_RATE_PER_GPU_HOUR,
    RunModel,
    expected_segment_s,
    expected_wall_s,
    project,
    project_band,
    segments,
    work_s_for_tokens,
    young_daly_interval_s,
)
from pipeline.measure.simulate import simulate

H = 3600.0


def test_default_rate_is_llama3s_interruptions_per_gpu_hour() -> None:
    # 419 interruptions / (54 days * 24 h * 16,384 GPUs)
    assert pytest.approx(419 / 21_233_664) == DEFAULT_RATE_PER_GPU_HOUR
    assert pytest.approx(1.9733e-5, rel=1e-4) == DEFAULT_RATE_PER_GPU_HOUR


def test_nothing_interrupts_the_run_then_it_takes_its_work_start_and_checkpoints() -> None:
    run = RunModel(work_s=10 * H, gpus=8, rate_per_gpu_hour=0.0, ckpt_stall_s=30, restart_s=600, start_s=120)
    assert run.mtbi_s is None and young_daly_interval_s(30, None) is None
    # 10 h of work in 1 h segments: 10 checkpoints
    assert expected_wall_s(run, H) == pytest.approx(120 + 10 * H + 10 * 30)
    p = project(run, price_usd_per_gpu_hour=2.0)
    assert p.wall_s == pytest.approx(120 + 10 * H + 30)  # one final checkpoint
    assert p.gpu_hours == pytest.approx(p.wall_s * 8 / H) and p.cost_usd == pytest.approx(p.gpu_hours * 2.0)


def test_daly_segment_time_by_hand() -> None:
    # L = 1 h, lambda = 1 per hour, no restart cost: (e - 1) h
    assert expected_segment_s(H, 0.0, 1 / H) == pytest.approx((math.e - 1) * H)
    # with a restart of 0.5 h: e^{0.5} (e - 1) h
    assert expected_segment_s(H, 0.5 * H, 1 / H) == pytest.approx(math.exp(0.5) * (math.e - 1) * H)
    # a tiny rate tends to the segment itself
    assert expected_segment_s(H, 600, 1e-12) == pytest.approx(H, rel=1e-6)


def test_young_interval_by_hand_and_it_is_near_the_optimum() -> None:
    # C = 60 s, a job of 64 GPUs at 1e-4 per GPU-hour: M = 1 / (6.4e-3 / h) = 156.25 h
    run = RunModel(work_s=500 * H, gpus=64, rate_per_gpu_hour=1e-4, ckpt_stall_s=60, restart_s=900)
    assert run.mtbi_s == pytest.approx(156.25 * H)
    tau = young_daly_interval_s(60, run.mtbi_s)
    assert tau == pytest.approx(math.sqrt(2 * 60 * 156.25 * H))
    at_tau = expected_wall_s(run, tau)
    assert at_tau < expected_wall_s(run, tau / 4) and at_tau < expected_wall_s(run, tau * 4)


def test_segments_cover_the_work() -> None:
    assert segments(10.0, 3.0) == [3.0, 3.0, 3.0, 1.0]
    assert segments(9.0, 3.0) == [3.0, 3.0, 3.0]
    with pytest.raises(ValueError):
        segments(9.0, 0.0)


def test_the_band_brackets_the_rate_and_costs_rise_with_it() -> None:
    run = RunModel(
        work_s=200 * H, gpus=256, rate_per_gpu_hour=DEFAULT_RATE_PER_GPU_HOUR, ckpt_stall_s=20, restart_s=600
    )
    low, mid, high = project_band(run, 2.5)
    assert low.rate_per_gpu_hour == pytest.approx(mid.rate_per_gpu_hour / 2)
    assert high.rate_per_gpu_hour == pytest.approx(mid.rate_per_gpu_hour * 2)
    assert low.cost_usd < mid.cost_usd < high.cost_usd  # type: ignore[operator]
    assert 0 < high.effective_ratio < mid.effective_ratio < low.effective_ratio < 1


def test_work_from_tokens() -> None:
    # 2e10 tokens at 1,000 tokens/s per GPU on 64 GPUs
    assert work_s_for_tokens(2e10, 1000.0, 64) == pytest.approx(2e10 / 64_000)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="rate_per_gpu_hour"):
        RunModel(work_s=1, gpus=1, rate_per_gpu_hour=-1, ckpt_stall_s=0, restart_s=0)
    with pytest.raises(ValueError, match="gpus"):
        RunModel(work_s=1, gpus=0, rate_per_gpu_hour=0, ckpt_stall_s=0, restart_s=0)


GRID = [
    # (work hours, gpus, rate per GPU-hour, checkpoint stall s, restart s)
    (24, 64, 1e-4, 30, 600),
    (24, 512, 1e-4, 120, 900),
    (100, 1024, DEFAULT_RATE_PER_GPU_HOUR, 10, 300),
    (6, 4096, 1e-4, 60, 1200),
    (48, 16384, DEFAULT_RATE_PER_GPU_HOUR, 5, 180),
]


@pytest.mark.parametrize(("hours", "gpus", "rate", "stall", "restart"), GRID)
def test_the_simulation_agrees_with_the_closed_form_within_2_percent(
    hours: float, gpus: int, rate: float, stall: float, restart: float
) -> None:
    run = RunModel(
        work_s=hours * H, gpus=gpus, rate_per_gpu_hour=rate, ckpt_stall_s=stall, restart_s=restart, start_s=60
    )
    for tau in (young_daly_interval_s(stall, run.mtbi_s), 1800.0):
        assert tau is not None
        closed = expected_wall_s(run, tau)
        sim = simulate(run, tau, runs=1500, seed=7)
        assert sim.mean_interruptions > 0
        assert abs(sim.mean_wall_s - closed) / closed < 0.02, (sim, closed)
