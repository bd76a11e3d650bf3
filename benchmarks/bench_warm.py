"""Warm ranks against cold ones: the default sweep on the local launcher, side by side in one run
(docs/design.md, "Warm ranks").

Each repeat runs the sweep twice as a user does (`qualify sweep --sweep default --launcher
local --wait`, a fresh SQLite store and runs folder each: bench_startup.sweep_runs), once with
`launcher.warm_ranks=false` (every rank a new interpreter: today's cold start) and once with
warm ranks, alternating which goes first so that a drift of the machine's load falls on both.
Printed: each sweep's wall time (the command's, submission to summary), the points' median
`time/startup_s` from MLflow, and cold / warm of the median wall times (goal >= 1.5 on an idle
2-core machine). Every point of both sweeps must be accepted.

Run: .venv/bin/python -m benchmarks.bench_warm [--repeats N] [--sweep default] [OVERRIDES...]
Exit 1 when the goal is missed or a point was not accepted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from benchmarks.bench_startup import sweep_runs
from pipeline.sched.warm import SHARED_ENV

GOAL = 1.5


def one_sweep(sweep: str, warm: bool, overrides: list[str]) -> tuple[float, list[float], list[str]]:
    """Wall seconds of one local sweep, its points' start-ups, their outcomes."""
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        started = time.perf_counter()
        runs = [
            r for _, r in sweep_runs(tmp, ["--sweep", sweep, "--launcher", "local"], overrides, warm=warm)
        ]
        wall = time.perf_counter() - started
        starts = [r.data.metrics["time/startup_s"] for r in runs if "time/startup_s" in r.data.metrics]
        kinds = {r.data.tags.get("sq.ranks") for r in runs}
        if kinds != {"warm" if warm else "cold"}:
            raise SystemExit(f"bench_warm: the {'warm' if warm else 'cold'} sweep's runs are tagged {kinds}")
        return wall, starts, [r.data.tags.get("sq.outcome", "") for r in runs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--sweep", default="default")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    # the warm sweep starts its own server, as the default sweep does: a shared one (SQ_WARM_SERVER)
    # would leave its imports out of the warm wall time
    os.environ.pop(SHARED_ENV, None)
    walls: dict[bool, list[float]] = {False: [], True: []}
    ok = True
    for i in range(args.repeats):
        for warm in (False, True) if i % 2 == 0 else (True, False):
            wall, starts, outcomes = one_sweep(args.sweep, warm, args.overrides)
            walls[warm].append(wall)
            name = "warm" if warm else "cold"
            med = f"{statistics.median(starts):.2f}" if starts else "-"
            print(f"{name}: {wall:.1f} s wall, {len(outcomes)} points, median time/startup_s {med}")
            if set(outcomes) != {"accepted"}:
                print(f"  not every point was accepted: {outcomes}")
                ok = False
    cold, warm_s = statistics.median(walls[False]), statistics.median(walls[True])
    ratio = cold / warm_s
    met = ratio >= GOAL
    print(
        f"default sweep cold {cold:.1f} s / warm {warm_s:.1f} s = {ratio:.2f}x "
        f"(goal >= {GOAL:g} on an idle machine: {'met' if met else 'NOT met'}); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    return 0 if ok and met else 1


if __name__ == "__main__":
    sys.exit(main())
