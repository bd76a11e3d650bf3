"""The steady window, the bootstrap intervals, the tie rule and the outlier rule against
independent references: hand computations, Student's t table, the normal-theory interval on a
large sample, the long-run variance of an AR(1) series, and coverage of a known ratio."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from pipeline.measure.steady import (
    block_bootstrap_means,
    cost_draws,
    hampel_outliers,
    mser_truncation,
    ratio_interval,
    repeats_needed,
    spread,
    steady_window,
    t_975,
)


@pytest.mark.parametrize(("df", "table"), [(3, 3.182), (5, 2.571), (10, 2.228), (16, 2.120), (30, 2.042)])
def test_t_quantile_matches_the_printed_table(df: int, table: float) -> None:
    assert t_975(df) == pytest.approx(table, abs=6e-3)


def test_mser_drops_a_slow_start_and_nothing_from_a_flat_series() -> None:
    # five slow warm-up steps then a steady, slightly noisy series
    steady = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.02, 0.98, 1.01, 0.99, 1.0, 1.01]
    assert mser_truncation([5.0, 4.0, 3.0, 2.0, 1.5, *steady]) == 5
    assert mser_truncation(steady) <= 1  # nothing, or one step, of a series with no trend
    w = steady_window([9.0, 9.0, *[5.0, 4.0, 3.0, 2.0, 1.5], *steady], warmup=2)
    assert w is not None and (w.warmup, w.mser, w.start) == (2, 5, 7)
    assert w.mean_s == pytest.approx(statistics.fmean(steady))
    assert steady_window([1.0, 2.0, 3.0], warmup=2) is None  # one step left: no spread


def test_bootstrap_interval_matches_the_normal_theory_interval_on_a_large_sample() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0.5, 0.05, 4000)
    draws = block_bootstrap_means(x, 4000, rng)
    lo, hi = np.percentile(draws, [2.5, 97.5])
    half = 1.96 * statistics.stdev(x) / math.sqrt(len(x))  # by hand, no numpy
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.08)
    assert (lo + hi) / 2 == pytest.approx(statistics.fmean(x), abs=0.1 * half)


def test_block_bootstrap_keeps_the_correlation_of_neighbouring_steps() -> None:
    # AR(1) with rho = 0.6: the mean's variance is sigma^2 (1 + rho) / (1 - rho) / n, four times
    # the i.i.d. figure; an i.i.d. bootstrap would report half the width
    rng = np.random.default_rng(2)
    rho, n = 0.6, 3000
    e = rng.normal(0, 1, n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = rho * x[i - 1] + e[i] * math.sqrt(1 - rho**2)
    sd = np.std(block_bootstrap_means(x, 3000, rng))
    long_run = math.sqrt((1 + rho) / (1 - rho) / n)
    assert sd == pytest.approx(long_run, rel=0.2)
    assert sd > 1.6 / math.sqrt(n)


def _ci(rng: np.random.Generator, ma: float, mb: float, cv: float, steps: int, runs: int):  # type: ignore[no-untyped-def]
    sa = spread([rng.normal(ma, cv * ma, steps) for _ in range(runs)], 2000, rng)
    sb = spread([rng.normal(mb, cv * mb, steps) for _ in range(runs)], 2000, rng)
    a, b = cost_draws(sa.mean_s, 1.0, sa), cost_draws(sb.mean_s, 1.0, sb)
    return ratio_interval(a, b, sb.mean_s / sa.mean_s)


def test_ratio_interval_covers_the_true_ratio_in_400_seeded_trials() -> None:
    rng = np.random.default_rng(26)
    covered = 0
    for _ in range(400):
        ci = _ci(rng, 1.0, 1.03, 0.10, 30, 1)
        covered += ci.low <= 1.03 <= ci.high
    assert covered / 400 >= 0.93


def test_three_percent_apart_at_ten_percent_cv_tie_then_separate_at_the_repeats_said() -> None:
    rng = np.random.default_rng(7)
    ones = [_ci(rng, 1.0, 1.03, 0.10, 30, 1) for _ in range(100)]
    # one repeat of 30 steady steps: the ratio's standard error (about 2.6%) is near the margin,
    # so most single repeats tie (a normal-theory figure: P(|Z + 1.15| < 1.96) = 0.79)
    ties = [ci for ci in ones if ci.tie]
    assert len(ties) >= 65, len(ties)
    ci = next(ci for ci in ties if ci.ratio > 1.01)  # a tie with a margin in the true direction
    need = repeats_needed(ci, 1)
    assert need is not None and need > 1
    separated = 0
    for _ in range(60):
        again = _ci(rng, 1.0, 1.03, 0.10, 30, need)
        separated += not again.tie and again.ratio > 1
    # the rule is sized for 90% power at the observed ratio; the observed one is noisy itself
    assert separated / 60 >= 0.75, (need, separated)


def test_repeats_needed_by_hand() -> None:
    from pipeline.measure.steady import RatioCI

    # log ratio 0.03, se 0.02: ((1.96 + 1.2816) * 0.02 / 0.029559)^2 = 4.81 -> 5 repeats
    assert repeats_needed(RatioCI(1.03, 0.99, 1.07, 0.02), 1) == 5
    assert repeats_needed(RatioCI(1.0, 0.9, 1.1, 0.02), 1) is None
    assert repeats_needed(RatioCI(2.0, 1.9, 2.1, 0.02), 3) == 3  # already separated


def test_step_share_scales_only_the_step_part_of_the_cost() -> None:
    rng = np.random.default_rng(3)
    sp = spread([rng.normal(1.0, 0.1, 30)], 500, rng)
    assert np.all(cost_draws(10.0, 0.0, sp) == 10.0)
    half = cost_draws(10.0, 0.5, sp)
    assert np.allclose(half, 5.0 + 5.0 * sp.draws / sp.mean_s)
    with pytest.raises(ValueError):
        cost_draws(10.0, 1.5, sp)


def test_hampel_flags_by_hand() -> None:
    # median 20, |x - 20| = 0 1 1 2 156 -> MAD 1, scaled 1.4826: only 176 is past 3 x 1.4826
    assert hampel_outliers([20, 19, 21, 18, 176]) == [4]
    assert hampel_outliers([20, 19]) == []  # too few to tell
    assert hampel_outliers([5, 5, 5, 5, 9]) == []  # MAD 0: no spread to measure against
    assert hampel_outliers([1.0, 1.02, 1.3]) == []  # 3 values: the MAD is one distance, not a spread


def test_run_to_run_spread_widens_the_interval() -> None:
    rng = np.random.default_rng(4)
    same = spread([rng.normal(1.0, 0.05, 30) for _ in range(4)], 2000, rng)
    # the second sweep's load: runs 1.0, 1.3, 0.8, 1.5 s per step
    loaded = spread([rng.normal(m, 0.05, 30) for m in (1.0, 1.3, 0.8, 1.5)], 2000, rng)
    assert same.tau_rel is not None and same.tau_rel < 0.02
    assert loaded.tau_rel is not None and loaded.tau_rel > 0.2
    lo, hi = loaded.interval()
    lo1, hi1 = same.interval()
    assert hi - lo > 5 * (hi1 - lo1)


def test_t_quantile_is_exact_at_one_and_two_degrees_of_freedom() -> None:
    assert t_975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_975(2) == pytest.approx(4.3027, abs=1e-4)


def test_run_bootstrap_of_a_cost_per_output_by_hand_and_its_coverage() -> None:
    from pipeline.measure.steady import run_ratio_draws

    rng = np.random.default_rng(9)
    same = run_ratio_draws([2.0, 2.0, 2.0], [1, 1, 1], 500, rng)
    assert np.allclose(same, 2.0)  # no spread between runs: none in the draws
    with pytest.raises(ValueError):
        run_ratio_draws([2.0], [1], 10, rng)
    # known truth: runs cost N(10, 2) per output; the interval of 5 runs' mean cost covers 10
    covered = 0
    for _ in range(300):
        d = run_ratio_draws(list(rng.normal(10.0, 2.0, 5)), [1] * 5, 1000, rng)
        lo, hi = np.percentile(d, [2.5, 97.5])
        covered += lo <= 10.0 <= hi
    assert covered / 300 >= 0.93, covered


def test_repeats_needed_over_runs_drops_the_small_sample_widening_as_runs_grow() -> None:
    from pipeline.measure.steady import RatioCI, widening

    # 3 runs, se 0.2 of which widening(3) = 2.7 is small-sample: the base se is 0.074
    ci = RatioCI(1.2, 0.7, 1.9, 0.2)
    plain = repeats_needed(ci, 3)
    runs = repeats_needed(ci, 3, over_runs=True)
    assert plain is not None and runs is not None and runs < plain
    k, base = 1.959964 + 1.281552, 0.2 / widening(3)
    assert k * base * math.sqrt(3 / runs) * widening(runs) <= math.log(1.2)
    assert k * base * math.sqrt(3 / (runs - 1)) * widening(runs - 1) > math.log(1.2)


def test_draws_without_output_make_the_interval_unbounded_not_undefined() -> None:
    """A bootstrap draw in which a candidate had no output is infinite. Four such runner-up draws
    in 100 once gave the interval a NaN top (numpy interpolates two infinite draws to NaN) and
    the decision read it as "beyond the noise"; the bounds are order statistics then, by hand:
    low = the 3rd smallest ratio (floor(0.025 x 99) = 2), high = the 98th (ceil(0.975 x 99) = 97)."""
    a = np.ones(100)
    b = np.linspace(0.5, 2.9, 100)
    b[-4:] = np.inf
    ci = ratio_interval(a, b, 1.678)
    assert ci.low == pytest.approx(0.5 + 2 * 2.4 / 99) and ci.high == math.inf
    assert ci.tie and not math.isfinite(ci.se_log)
    assert repeats_needed(ci, 2, over_runs=True) is None  # no spread to size repeats by
    # the winner (a) without output in 3 draws: those ratios are 0 (finite: interpolated as
    # before), low at position 0.025 x 99 = 2.475, between the 3rd (0) and the 4th (1.5): a tie
    a2 = np.full(100, 2.0)
    a2[:3] = np.inf
    low_win = ratio_interval(a2, np.full(100, 3.0), 1.5)
    assert low_win.low == pytest.approx(0.475 * 1.5) and low_win.high == 1.5 and low_win.tie
    # neither with output in a draw: no ratio; taken as 0 for low and infinite for high
    both = ratio_interval(np.array([np.inf] * 5 + [1.0] * 95), np.array([np.inf] * 5 + [3.0] * 95), 3.0)
    assert both.low == 0.0 and both.high == math.inf and both.tie
    # every draw finite: the interpolated percentiles as before, np.percentile's own
    c = np.linspace(1.1, 1.9, 100)
    assert (
        ratio_interval(np.ones(100), c, 1.5).low,
        ratio_interval(np.ones(100), c, 1.5).high,
    ) == pytest.approx(tuple(np.percentile(c, [2.5, 97.5])))
    # runner-up without output in a few draws only strengthens a clear winner: not a tie
    sure = np.full(100, 1.5)
    sure[:2] = np.inf
    assert not ratio_interval(np.ones(100), sure, 1.5).tie
