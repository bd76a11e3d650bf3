"""The projection's closed form (Daly 2006) against the event-by-event simulation, over a grid
of interruption rates, checkpoint stalls and run lengths: prints both and their difference.

    .venv/bin/python -m benchmarks.bench_projection [--runs 4000]
"""

from __future__ import annotations

import argparse
import itertools
import time

from pipeline.measure.projection import (
    DEFAULT_RATE_PER_GPU_HOUR,
    RunModel,
    expected_wall_s,
    young_daly_interval_s,
)
from pipeline.measure.simulate import simulate

H = 3600.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=4000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(
        f"{'hours':>6} {'gpus':>6} {'rate/GPU-h':>11} {'stall s':>8} {'tau s':>8} {'closed h':>10} {'sim h':>10} {'diff':>8}"
    )
    worst = 0.0
    for hours, gpus, rate, stall in itertools.product(
        (12, 100), (64, 1024, 16384), (DEFAULT_RATE_PER_GPU_HOUR, 1e-4), (5, 60, 300)
    ):
        run = RunModel(
            work_s=hours * H,
            gpus=gpus,
            rate_per_gpu_hour=rate,
            ckpt_stall_s=stall,
            restart_s=600,
            start_s=120,
        )
        tau = young_daly_interval_s(stall, run.mtbi_s)
        assert tau is not None
        closed = expected_wall_s(run, tau)
        sim = simulate(run, tau, runs=args.runs, seed=1)
        diff = (sim.mean_wall_s - closed) / closed
        worst = max(worst, abs(diff))
        print(
            f"{hours:>6} {gpus:>6} {rate:>11.3g} {stall:>8} {tau:>8.0f} {closed / H:>10.3f} {sim.mean_wall_s / H:>10.3f} {diff:>+8.2%}"
        )
    print(
        f"largest |simulated - closed form| / closed form: {worst:.2%} (goal: under 2%), {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
