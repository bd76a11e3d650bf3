"""Adaptive qualification against the full grid on seeded simulated sweeps: candidates with known
mean step times and step-time noise; prints how often the adaptive mode picks the full grid's
winner (and the true one) and the GPU-hours each spent.

    .venv/bin/python benchmarks/bench_adaptive.py [--sweeps 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pipeline.measure.adaptive import adaptive, full_grid

MEANS = (1.0, 1.06, 1.12, 1.25, 1.5, 2.0)  # seconds per step: the best 6% ahead of the next
CV, STEPS, REPEATS = 0.10, 30, 5


def run(sweeps: int, seed: int = 26) -> dict[str, float]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sweeps", type=int, default=200)
    args = ap.parse_args()
    t0 = time.perf_counter()
    r = run(args.sweeps)
    saved = 1 - r["hours_adaptive"] / r["hours_full"]
    print(
        f"candidates: mean step s {MEANS}, CV {CV:.0%}, {STEPS} steady steps a repeat, full grid {REPEATS} repeats"
    )
    print(
        f"adaptive picks the full grid's winner in {r['same']:.1%} of {args.sweeps} sweeps (the true best: {r['true']:.1%})"
    )
    print(
        f"GPU-hours (step-hours per GPU): full grid {r['hours_full']:.2f}, adaptive {r['hours_adaptive']:.2f} "
        f"({saved:.1%} fewer); {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
