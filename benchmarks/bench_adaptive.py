"""Adaptive qualification against the full grid on seeded simulated sweeps: candidates with known
mean step times and step-time noise; prints how often the adaptive mode picks the full grid's
winner (and the true one) and the GPU-hours each spent.

    .venv/bin/python -m benchmarks.bench_adaptive [--sweeps 200]
"""

from __future__ import annotations

import argparse
import time

from tests.support.adaptive_sim import CV, MEANS, REPEATS, STEPS, run


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
