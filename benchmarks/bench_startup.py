"""Start-up of the first point of a sweep against the others (goal: at most 1.2x their median).

The first job of a sweep used to pay for what later ones reuse (DeepSpeed's C++ ops built in
the job, cold imports): DeepSpeed's ops are now built at install (scripts/prebuild_ops.py), with
the venv's ninja first on PATH for every job. This runs the embedded default sweep as a user
does (`qualify sweep --sweep default --wait`, local executor, a fresh SQLite store) and reads
each point's `time/startup_s` (process start to a trainer ready to step) through MLflow.

Run: .venv/bin/python benchmarks/bench_startup.py [--sweep default] [ARGS...]
Exit 1 when the ratio is above the goal.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default="default")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        uri = f"sqlite:///{tmp}/mlruns.db"
        cmd = [sys.executable, "-m", "pipeline.cli", "sweep", "--sweep", args.sweep, "--wait"]
        cmd += [f"runs_dir={tmp}/runs", f"tracking.uri={uri}", *args.overrides]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            print(res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr)
            return 2
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name("slurm-qualify")
        assert exp is not None
        runs = client.search_runs([exp.experiment_id], "tags.`sq.kind` = 'point'", max_results=1000)
    startup = {
        r.data.tags["sq.point_id"]: r.data.metrics["time/startup_s"]
        for r in runs
        if "time/startup_s" in r.data.metrics
    }
    if len(startup) < 3:
        print(f"bench_startup: only {len(startup)} points measured their start-up", file=sys.stderr)
        return 2
    first, *others = [startup[k] for k in sorted(startup)]
    median = statistics.median(others)
    ratio = first / median
    print(f"bench_startup: sweep '{args.sweep}', {len(startup)} points with time/startup_s (MLflow)")
    for k in sorted(startup):
        print(f"  {k:<60} {startup[k]:7.2f} s")
    print(
        f"first point {first:.2f} s / median of the other {len(others)} {median:.2f} s = {ratio:.2f} "
        f"(goal <= {GOAL:g}: {'met' if ratio <= GOAL else 'NOT met'})"
    )
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
