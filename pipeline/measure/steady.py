"""Steady-state step time with its spread, the interval of a ratio of two candidates' costs,
the repeats that would separate them, and outliers. Pure functions (numpy only).

The rules (docs/design.md, "The decision and its confidence"):

- **Window.** A run's steady window starts after the larger of its configured warm-up
  (train.warmup_steps, logged as perf/warmup_steps_excluded) and the MSER truncation point
  (White 1997: the d that minimises the variance of the remaining steps over (n - d)^2, searched
  over the first half of the series), and runs to the last step. NVIDIA's recipes time
  iterations 35-44 of 50: a fixed share, which MSER replaces by what the series itself shows.
- **Within a run.** The mean step time of the window (cost is the sum of the step times, so the
  mean, not the median, is what a cost scales with), with a moving-block bootstrap over its steps
  (Kuensch 1989), circular (Politis and Romano 1992), block length ceil(n^(1/3)), so
  neighbouring steps' correlation is kept.
- **Over runs.** Each run is a stratum, bootstrapped within itself; the run-to-run spread beyond
  what the steps explain is a one-way random effect estimated by moments (var of the run means
  minus the mean of their bootstrap variances, at least 0) and applied to each draw as a
  log-normal factor exp(N(0, tau^2 / runs)) (relative tau). One run: that term is unknown and left out (said so).
- **Over runs, for a realised cost.** With two or more runs, a cost per output is bootstrapped
  over its runs (ratio of sums), the same small-sample widening with R - 1 degrees of freedom.
- **Intervals.** Percentile intervals of the draws (Efron and Tibshirani 1993, ch. 13).
- **Tie.** Two candidates tie when the 95% interval of the ratio of their costs includes 1. The
  repeats that would separate them at the observed spread: the R with
  (z_0.975 + z_0.9) * se(R) <= |log ratio|, se(R) = se(r) * sqrt(r / R) (90% power).
- **Outliers.** A value more than 3 scaled MADs (1.4826 * MAD) from the median of its group
  (Hampel's identifier; Leys et al. 2013), in a group of at least 5 values (with 3 the MAD is
  the smaller of two distances and flags ordinary noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Z_975 = 1.959963984540054  # standard normal quantile 0.975
Z_90 = 1.2815515655446004  # standard normal quantile 0.90 (power of the repeats' rule)
BOOTSTRAP_DRAWS = 2000
HAMPEL_K = 3.0
MIN_GROUP = 5
MAD_SCALE = 1.4826  # MAD -> standard deviation of a normal sample
WINDOW_RULE = (
    "steady window: from the larger of the configured warm-up and the MSER truncation point "
    "(White 1997; searched over the first half) to the last step"
)


def mser_truncation(times: Sequence[float]) -> int:
    """White's MSER: the number of leading steps d (at most half the series) that minimises
    var(times[d:]) / (n - d)^2, i.e. the squared standard error of the mean of what is kept."""
    x = np.asarray(times, dtype=float)
    n = len(x)
    if n < 4:
        return 0
    best_d, best = 0, math.inf
    for d in range(n // 2 + 1):
        rest = x[d:]
        score = float(np.var(rest)) / (len(rest) ** 2)
        if score < best:
            best_d, best = d, score
    return best_d


@dataclass(frozen=True)
class Window:
    """The steady steps of a run: times[start:]."""

    start: int
    warmup: int  # the configured warm-up
    mser: int  # MSER's truncation point
    steps: tuple[float, ...]

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.steps))


def steady_window(times: Sequence[float], warmup: int) -> Window | None:
    """The run's steady window (module docstring); None when fewer than 2 steps remain."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    after = list(times[warmup:])
    if len(after) < 2:
        return None
    d = mser_truncation(after)
    kept = tuple(float(t) for t in after[d:])
    return Window(warmup + d, warmup, d, kept)


def block_length(n: int) -> int:
    return max(1, math.ceil(n ** (1 / 3)))


def block_bootstrap_means(
    x: Sequence[float] | np.ndarray, draws: int, rng: np.random.Generator
) -> np.ndarray:
    """Circular block bootstrap (Politis and Romano 1992) of the mean of x: `draws` resampled
    means, spread about the sample mean by sqrt(n / (n - 1)) * t_{n-1} / z (the bootstrap's
    variance of a mean is the plug-in one, short by (n - 1) / n, and its percentiles are normal
    ones where a mean of n steps has Student's t_{n-1}: together 9% narrow at 17 steps)."""
    a = np.asarray(x, dtype=float)
    n = len(a)
    if n == 0:
        raise ValueError("no steps to resample")
    b = min(block_length(n), n)
    k = math.ceil(n / b)
    starts = rng.integers(0, n, size=(draws, k))
    idx = ((starts[:, :, None] + np.arange(b)) % n).reshape(draws, k * b)[:, :n]
    means = a[idx].mean(axis=1)
    return _widen(means, float(a.mean()), widening(n))


def _widen(draws: np.ndarray, centre: float, factor: float) -> np.ndarray:
    """The draws spread about the centre by `factor`, on the log scale where all are positive
    (a step time or a cost stays positive however noisy), else linearly."""
    if centre > 0 and bool(np.all(draws > 0)):
        return centre * np.exp((np.log(draws) - math.log(centre)) * factor)
    return centre + (draws - centre) * factor


def t_975(df: int) -> float:
    """Student's t quantile 0.975: exact closed forms for 1 and 2 degrees of freedom, then the
    Cornish-Fisher expansion (Abramowitz and Stegun 26.7.5; within 0.2% from 3)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df == 1:  # Cauchy: tan(pi (p - 1/2)), exact
        return math.tan(math.pi * 0.475)
    if df == 2:  # (2p - 1) / sqrt(2 p (1 - p)), exact
        return 0.95 / math.sqrt(2 * 0.975 * 0.025)
    z, v = Z_975, float(df)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / v + g2 / v**2 + g3 / v**3 + g4 / v**4


@dataclass(frozen=True)
class Spread:
    """A candidate's steady mean step time over its runs, with bootstrap draws."""

    mean_s: float  # pooled: all steady steps' mean (runs weighted by their steps)
    draws: np.ndarray  # bootstrap draws of mean_s
    runs: int
    steps: int
    tau_rel: float | None  # run-to-run relative spread beyond the steps' (None: one run)

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        return percentile_interval(self.draws, level)

    @property
    def se_log(self) -> float:
        """Standard error of log(mean_s) from the draws."""
        return float(np.std(np.log(self.draws), ddof=1))


def percentile_interval(draws: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(draws, [tail, 100 - tail])
    return float(lo), float(hi)


def spread(windows: Sequence[Sequence[float] | np.ndarray], draws: int, rng: np.random.Generator) -> Spread:
    """Pool the runs' steady windows (module docstring: strata + random effect)."""
    runs = [np.asarray(w, dtype=float) for w in windows if len(w) > 0]
    if not runs:
        raise ValueError("no steady steps in any run")
    n = np.array([len(r) for r in runs], dtype=float)
    means = np.array([r.mean() for r in runs])
    boot = np.stack([block_bootstrap_means(r, draws, rng) for r in runs])  # runs x draws
    pooled = float((n * means).sum() / n.sum())
    pooled_draws = (n[:, None] * boot).sum(axis=0) / n.sum()
    tau_rel = None
    if len(runs) > 1:
        within = float(np.mean(np.var(boot, axis=1, ddof=1)))
        tau2 = max(0.0, float(np.var(means, ddof=1)) - within)
        tau_rel = math.sqrt(tau2) / pooled
        # on the log scale: a wide run-to-run spread keeps every draw positive
        pooled_draws = pooled_draws * np.exp(rng.normal(0.0, tau_rel / math.sqrt(len(runs)), draws))
    return Spread(pooled, pooled_draws, len(runs), int(n.sum()), tau_rel)


@dataclass(frozen=True)
class RatioCI:
    """cost(b) / cost(a) with its percentile interval; > 1: a is cheaper."""

    ratio: float
    low: float
    high: float
    se_log: float

    @property
    def tie(self) -> bool:
        """The interval includes 1 (an undefined bound counts as including it: never a win)."""
        return not (self.low > 1.0 or self.high < 1.0)


def ratio_interval(a: np.ndarray, b: np.ndarray, point: float, level: float = 0.95) -> RatioCI:
    """The interval of b / a from two independent candidates' draws (same length).

    A draw in which a candidate had no output is infinite (run_ratio_draws), so its ratio is 0
    or infinite, and undefined where neither had one. With such draws the bounds are order
    statistics, not interpolated (numpy interpolates two infinite draws to NaN, and a NaN bound
    once read as "beyond the noise"), an undefined ratio taken as 0 for the low bound and as
    infinite for the high one: the interval holds whatever those draws would have been."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.asarray(b, dtype=float) / np.asarray(a, dtype=float)
        se_log = float(np.std(np.log(r), ddof=1))  # not finite with such draws
    if np.isfinite(r).all():
        lo, hi = percentile_interval(r, level)
    else:
        tail = (1 - level) / 2 * 100
        lo = float(np.percentile(np.where(np.isnan(r), 0.0, r), tail, method="lower"))
        hi = float(np.percentile(np.where(np.isnan(r), np.inf, r), 100 - tail, method="higher"))
    return RatioCI(point, lo, hi, se_log)


def widening(n: int) -> float:
    """sqrt(n / (n - 1)) x t_{n-1} / z: how much wider than the plug-in bootstrap the intervals
    are drawn for a mean of n values (1 for n < 2)."""
    return math.sqrt(n / (n - 1)) * t_975(n - 1) / Z_975 if n > 1 else 1.0


def repeats_needed(ci: RatioCI, repeats: int, over_runs: bool = False) -> int | None:
    """Repeats (each as long as those measured) that would separate the two at the observed
    spread with 90% power; None when the observed ratio is exactly 1 (no margin to resolve) or
    the spread is not finite. `over_runs`: the interval was bootstrapped over the runs and
    widened for `repeats` runs: the widening at R runs replaces it (it shrinks as R grows)."""
    margin = abs(math.log(ci.ratio))
    if margin == 0 or not math.isfinite(ci.se_log) or not math.isfinite(margin):
        return None
    k = Z_975 + Z_90
    if not over_runs or repeats < 2:
        return max(repeats, math.ceil(repeats * (k * ci.se_log / margin) ** 2))
    base = ci.se_log / widening(repeats)
    for r in range(repeats, 100_001):
        if k * base * math.sqrt(repeats / r) * widening(r) <= margin:
            return r
    return None


def cost_draws(cost_per_output: float, step_share: float, sp: Spread) -> np.ndarray:
    """Draws of a cost per output whose `step_share` (productive time / allocated time) scales
    with the mean step time and the rest (start-up, saves, fixed charges) does not."""
    if not 0 <= step_share <= 1:
        raise ValueError(f"step_share must be in [0, 1], got {step_share}")
    return cost_per_output * (1 - step_share + step_share * sp.draws / sp.mean_s)


def run_ratio_draws(
    costs: Sequence[float], outputs: Sequence[float], draws: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap over runs of sum(cost) / sum(outputs) (a candidate's cost per output over its
    repeats: start-up, saves and step time all vary from run to run), spread about the point by
    sqrt(R / (R - 1)) x t_{R-1} / z as the step bootstrap is. A draw with no output is infinite."""
    c, k = np.asarray(costs, dtype=float), np.asarray(outputs, dtype=float)
    n = len(c)
    if n < 2 or len(k) != n or k.sum() <= 0:
        raise ValueError("needs two or more runs with their costs and at least one output")
    idx = rng.integers(0, n, size=(draws, n))
    num, den = c[idx].sum(axis=1), k[idx].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1), np.inf)
    point = float(c.sum() / k.sum())
    finite = np.isfinite(out)
    out[finite] = _widen(out[finite], point, widening(n))
    return out


def hampel_outliers(values: Sequence[float], k: float = HAMPEL_K) -> list[int]:
    """Indices of the values more than k scaled MADs from the median (>= 5 values, else none).
    A MAD of 0 (most values equal) flags nothing: no spread to measure against."""
    x = np.asarray(values, dtype=float)
    if len(x) < MIN_GROUP:
        return []
    med = float(np.median(x))
    mad = MAD_SCALE * float(np.median(np.abs(x - med)))
    if mad == 0:
        return []
    return [i for i, v in enumerate(x) if abs(v - med) > k * mad]
