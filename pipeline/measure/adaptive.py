"""Adaptive qualification, as a policy and its simulation (pure; pipeline/measure/steady.py's
intervals): a first round of one repeat of every candidate, then further rounds only for the
candidates whose cost interval still overlaps the best one's (successive halving with an
interval rule: Jamieson and Talwalkar 2016 halve by rank, this drops by the 95% interval), until
one is left or `max_rounds` repeats were spent. The full grid runs `max_rounds` repeats of every
candidate. `next_round` is the rule both the simulation here and `qualify sweep` with
sweep.adaptive=true (pipeline/submit/adaptive.py) apply between rounds; benchmarks/bench_adaptive.py
simulates both on synthetic candidates with known step-time means and noise.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from pipeline.measure.steady import ratio_interval, spread

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True)
class SimulatedSweep:
    winner: int
    gpu_hours: float
    rounds: int


def _run(rng: np.random.Generator, mean_s: float, cv: float, steps: int) -> np.ndarray:
    return rng.normal(mean_s, cv * mean_s, steps)


def survivors(windows: Mapping[C, list[np.ndarray]], rng: np.random.Generator, draws: int) -> list[C]:
    """The candidates whose interval of cost over the best's includes 1 (the best among them)."""
    spreads = {c: spread(w, draws, rng) for c, w in windows.items()}
    best = min(spreads, key=lambda c: spreads[c].mean_s)
    keep = [best]
    for c, sp in spreads.items():
        if c == best:
            continue
        ci = ratio_interval(spreads[best].draws, sp.draws, sp.mean_s / spreads[best].mean_s)
        if ci.tie:
            keep.append(c)
    return keep


@dataclass(frozen=True)
class Round:
    contenders: list  # the candidates still in contention after the last round (best first)
    repeat: list  # those that get one more repeat in the next round; empty: the rounds are over


def next_round(
    windows: Mapping[C, list[np.ndarray]],
    max_repeats: int,
    rng: np.random.Generator,
    draws: int = 1000,
    min_repeats: int = 1,
) -> Round:
    """After a round: `windows` holds the steady step-time windows of every run of each candidate
    still in contention (a candidate without one, e.g. all its runs failed, is out). The next
    round repeats the contenders that have fewer than `max_repeats` runs, unless one is left.
    While a candidate has fewer than `min_repeats` runs, none is dropped (best first)."""
    measured = {c: w for c, w in windows.items() if w}
    if not measured:
        return Round([], [])
    if min(len(w) for w in measured.values()) < min_repeats:
        alive = sorted(measured, key=lambda c: float(np.mean(np.concatenate(measured[c]))))
        return Round(alive, [c for c in alive if len(measured[c]) < max_repeats])
    alive = survivors(measured, rng, draws) if len(measured) > 1 else list(measured)
    if len(alive) == 1:
        return Round(alive, [])
    return Round(alive, [c for c in alive if len(measured[c]) < max_repeats])


def adaptive(
    means: Sequence[float],
    cv: float,
    steps: int,
    max_rounds: int,
    rng: np.random.Generator,
    draws: int = 1000,
) -> SimulatedSweep:
    """One simulated adaptive qualification; GPU-hours in units of step-seconds / 3600."""
    windows: dict[int, list[np.ndarray]] = {c: [] for c in range(len(means))}
    alive = list(windows)
    spent = 0.0
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        for c in alive:
            w = _run(rng, means[c], cv, steps)
            windows[c].append(w)
            spent += float(w.sum())
        nxt = next_round({c: windows[c] for c in alive}, max_rounds, rng, draws)
        alive = nxt.contenders
        if not nxt.repeat:
            break
    winner = min(alive, key=lambda c: float(np.mean(np.concatenate(windows[c]))))
    return SimulatedSweep(winner, spent / 3600, rounds)


def full_grid(
    means: Sequence[float], cv: float, steps: int, repeats: int, rng: np.random.Generator
) -> SimulatedSweep:
    """Every candidate `repeats` times; the winner is the lowest mean step time."""
    totals = [np.concatenate([_run(rng, m, cv, steps) for _ in range(repeats)]) for m in means]
    spent = sum(float(t.sum()) for t in totals)
    return SimulatedSweep(int(np.argmin([t.mean() for t in totals])), spent / 3600, repeats)
