"""Cost and goodput, checked against hand arithmetic."""

from __future__ import annotations

import pytest

from pipeline.measure.cost import (
    Attempt,
    BadputParts,
    CostBreakdown,
    CostParams,
    Price,
    cost_per_finished_run,
    cost_per_successful_checkpoint,
    goodput,
    run_cost,
    sum_costs,
    tokens_per_dollar,
)

PRICE = Price(usd_per_gpu_hour=2.50, date="2026-11-01", source="example price list")
PARAMS = CostParams(
    storage_usd_per_gb_month=0.02,
    retention_days=30,
    egress_usd_per_gb=0.09,
    orchestration_usd_per_run=0.10,
    labor_usd_per_hour=100.0,
    labor_hours_per_failure=0.5,
)


def test_two_failed_attempts_then_accepted() -> None:
    # One run, three attempts of 4 GPUs x 0.5 h: a crash that needed a person, a preemption
    # requeued automatically, then the attempt that finished.
    attempts = [Attempt(4, 1800, needed_person=True), Attempt(4, 1800), Attempt(4, 1800)]
    c = run_cost(attempts, PRICE, PARAMS, ckpt_bytes_stored=10 * 10**9, egress_bytes=5 * 10**9)
    # compute: 3 * 4 GPUs * 0.5 h = 6 GPU-h * $2.50 = $15.00
    assert c.gpu_hours == pytest.approx(6.0)
    assert c.compute == pytest.approx(15.0)
    # storage: $0.02/GB-month * 10 GB * 30/30 month = $0.20
    assert c.storage == pytest.approx(0.20)
    # egress: $0.09/GB * 5 GB = $0.45
    assert c.egress == pytest.approx(0.45)
    # orchestration once per run: $0.10
    assert c.overhead == pytest.approx(0.10)
    # labor: 1 failure needing a person * 0.5 h * $100/h = $50
    assert c.labor == pytest.approx(50.0)
    # total 15 + 0.20 + 0.45 + 0.10 + 50 = $65.75
    assert c.total == pytest.approx(65.75)
    # One accepted run: $65.75 per finished run; 5 verified checkpoints: 65.75/5 = $13.15 each.
    assert cost_per_finished_run(c.total, 1) == pytest.approx(65.75)
    assert cost_per_successful_checkpoint(c.total, 5) == pytest.approx(13.15)
    # 1,000,000 accepted tokens / $65.75 = 15,209.125... tokens per dollar
    assert tokens_per_dollar(1_000_000, c.total) == pytest.approx(15_209.125475)


def test_retention_is_prorated_and_gb_is_decimal() -> None:
    # 7 days of 10 GB at $0.02/GB-month: 0.02 * 10 * 7/30 = $0.046666...
    # 10 GiB = 10.737... GB, billed as such: 0.02 * 10.737418 * 1 = $0.214748
    seven = CostParams(0.02, 7, 0.0, 0.0, 0.0, 0.0)
    assert run_cost([], PRICE, seven, 10 * 10**9, 0).storage == pytest.approx(0.0466667, abs=1e-7)
    assert run_cost([], PRICE, PARAMS, 10 * 2**30, 0).storage == pytest.approx(0.2147484, abs=1e-7)


def test_candidate_with_no_accepted_run() -> None:
    # Two runs, both ended by OOM on 8 GPUs after 6 minutes: 2 * 8 * 0.1 h = 1.6 GPU-h = $4.00
    # + 2 * $0.10 orchestration = $4.20 spent, nothing accepted.
    runs = [run_cost([Attempt(8, 360)], PRICE, PARAMS, 0, 0) for _ in range(2)]
    total = sum_costs(runs)
    assert total.gpu_hours == pytest.approx(1.6)
    assert total.total == pytest.approx(4.20)
    assert cost_per_finished_run(total.total, 0) is None
    assert cost_per_successful_checkpoint(total.total, 0) is None
    assert tokens_per_dollar(0, total.total) == 0.0  # money spent, nothing accepted: zero, defined


def test_unknown_or_zero_cost() -> None:
    assert cost_per_finished_run(None, 3) is None
    assert tokens_per_dollar(1000, None) is None
    assert tokens_per_dollar(1000, 0.0) is None  # free: tokens per dollar is not defined


def test_missing_price_raises() -> None:
    with pytest.raises(ValueError, match="no GPU price"):
        run_cost([Attempt(4, 1800)], None, PARAMS, 0, 0)
    with pytest.raises(ValueError, match="usd_per_gpu_hour"):
        run_cost([Attempt(4, 1800)], Price(-1.0, "2026-11-01", "typo"), PARAMS, 0, 0)
    with pytest.raises(ValueError, match="allocated_s"):
        run_cost([Attempt(4, float("nan"))], PRICE, PARAMS, 0, 0)


def test_sum_costs_part_by_part() -> None:
    a = CostBreakdown(1.0, 2.0, 3.0, 4.0, 5.0, 15.0, 0.5)
    assert sum_costs([a, a]) == CostBreakdown(2.0, 4.0, 6.0, 8.0, 10.0, 30.0, 1.0)
    assert sum_costs([]).total == 0


def test_goodput_breakdown() -> None:
    # 1 h allocated, 45 min of steps that count; startup 120 + save 60 + restore 30 + lost 90
    # + drills 300 = 600 s; idle = 3600 - 2700 - 600 = 300 s; goodput 2700/3600 = 0.75
    parts = BadputParts(startup_s=120, ckpt_save_s=60, restore_s=30, lost_work_s=90, drills_s=300)
    g = goodput(2700, 3600, parts)
    assert g.goodput == pytest.approx(0.75)
    assert g.idle_s == pytest.approx(300)
    assert (g.startup_s, g.ckpt_save_s, g.restore_s, g.lost_work_s, g.drills_s) == (120, 60, 30, 90, 300)


def test_goodput_never_negative_idle_nor_above_one() -> None:
    # Parts overshoot: 100 - 90 - 20 = -10 -> idle 0; goodput 0.9
    g = goodput(90, 100, BadputParts(startup_s=20))
    assert g.idle_s == 0.0
    assert g.goodput == pytest.approx(0.9)
    # sacct's whole seconds can make allocated a hair short of productive: capped at 1.
    assert goodput(100.4, 100, BadputParts()).goodput == 1.0
    assert goodput(0, 0, BadputParts()).goodput is None
    with pytest.raises(ValueError, match="lost_work_s"):
        goodput(10, 100, BadputParts(lost_work_s=-1))
