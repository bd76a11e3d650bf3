"""Submit time of a sweep on the real (local) Slurm: 300 points over 30 points, goal <= 3.

The points are the slurm_ci preset (a100, h100, h200) times `train.seed=1,...,n/3` (a comma
list on any key adds a sweep axis), so each size is three job arrays. They are submitted held
(`launcher.hold=true`, sbatch --hold) and cancelled right after with scancel: nothing runs.
Both sizes are measured side by side in one run, alternating, median of the repetitions:

- command: wall time of `qualify sweep` as a user runs it (process start to return, i.e. what
  `make sweep` makes you wait for); the goal applies to this figure;
- in process: the same work without the process start and imports, split into plan (compose +
  validate + the cluster check) and submit (manifest, MLflow parent run, point files, pickles,
  sbatch), to show where the time per point goes.

With --huge N (e.g. 10000) it submits one sweep of N points instead, held and cancelled, in
arrays no larger than the cluster's MaxArraySize (`scontrol show config`), and prints the wall time
of `qualify sweep` against the goal of 60 s, with the arrays it made.

Run: .venv/bin/python -m benchmarks.bench_submit [--small 30 --large 300 --reps 3] [--huge 10000]
Needs the local Slurm (make cluster-up): without it, skipped (exit 0; exit 2 under CI=true).
Exit 1 if the goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline.slurm.commands import answers as slurm_answers
from pipeline.slurm.commands import cancel
from pipeline.submit.sweep import plan, submit

ROOT = Path(__file__).resolve().parent.parent

PARTITIONS = ("ci_a100", "ci_h100", "ci_h200")  # the local test cluster's presets
GOAL = 3.0
HUGE_GOAL_S = 60.0


def overrides_for(n: int, root: Path, uri: str) -> list[str]:
    seeds = ",".join(str(s) for s in range(1, n // len(PARTITIONS) + 1))
    return [
        f"partition={','.join(PARTITIONS)}",
        f"train.seed={seeds}",
        "launcher.hold=true",
        f"runs_dir={root / 'runs'}",
        f"tracking.uri={uri}",
        "tracking.experiment=bench-submit",
    ]


def in_process(n: int, root: Path, uri: str) -> tuple[float, float, int]:
    """(plan s, submit s, points) for a sweep of n points, submitted held and then cancelled."""
    t0 = time.perf_counter()
    pl = plan("slurm_ci", overrides_for(n, root, uri), launcher_kind="slurm")
    t1 = time.perf_counter()
    try:
        m = submit(pl)
        t2 = time.perf_counter()
    finally:
        cancel({p.job_id.split("_")[0] for p in pl.manifest.points if p.job_id})
    assert all(p.job_id for p in m.points), "a point has no job id"
    return t1 - t0, t2 - t1, len(pl.points)


def command(n: int, root: Path, uri: str, keep: bool = False) -> Any:
    """Wall time of `qualify sweep` (held), its jobs cancelled after; with `keep`, (wall time,
    the sweep's manifest)."""
    cmd = [sys.executable, "-m", "pipeline.cli", "sweep", "--sweep", "slurm_ci", "--launcher", "slurm"]
    t0 = time.perf_counter()
    out = subprocess.run(
        [*cmd, *overrides_for(n, root, uri)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - t0
    m = re.search(r"sweep id: (\S+)", out.stdout)
    if out.returncode != 0 or not m:
        raise SystemExit(f"qualify sweep failed (rc={out.returncode}):\n{out.stdout}\n{out.stderr}")
    manifest = json.loads((root / "runs" / m.group(1) / "manifest.json").read_text())
    cancel({p["job_id"].split("_")[0] for p in manifest["points"] if p["job_id"]})
    return (wall, manifest) if keep else wall


def huge(n: int) -> int:
    """One sweep of n points as a user submits it: `qualify sweep` (held), timed from process
    start to return (compose, validate, the cluster check, manifest, parent run, point files,
    pickles, sbatch in arrays no larger than MaxArraySize); cancelled after. In-process plan
    and submit times of the same size follow, to show where the time goes."""
    from pipeline.slurm.cluster import max_array_size

    limit = max_array_size()
    with tempfile.TemporaryDirectory(prefix="bench-submit-") as tmp:
        root = Path(tmp)
        uri = f"sqlite:///{root / 'mlruns.db'}"
        in_process(len(PARTITIONS), root, uri)  # warm-up: MLflow schema, sbatch
        wall, manifest = command(n, root, uri, keep=True)
        plan_s, submit_s, _ = in_process(n, root, uri)
    points = manifest["points"]
    arrays: dict[str, int] = {}
    for p in points:
        arrays[p["job_id"].split("_")[0]] = arrays.get(p["job_id"].split("_")[0], 0) + 1
    ok = wall < HUGE_GOAL_S and max(arrays.values()) <= limit and all(p["job_id"] for p in points)
    print(f"bench_submit --huge: {len(points)} points (slurm_ci x train.seed), held then cancelled")
    print(f"  MaxArraySize (scontrol show config): {limit}")
    print(f"  arrays: {len(arrays)}, largest {max(arrays.values())} tasks, smallest {min(arrays.values())}")
    print(
        f"  qualify sweep, process start to return: {wall:.1f} s (goal < {HUGE_GOAL_S:.0f} s: "
        f"{'met' if ok else 'NOT met'}); {1000 * wall / len(points):.2f} ms/point"
    )
    print(
        f"  in process, same size: plan (compose + validate + cluster check) {plan_s:.1f} s, "
        f"submit (manifest, parent run, point files, pickles, sbatch) {submit_s:.1f} s"
    )
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=30)
    ap.add_argument("--large", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--huge", type=int, default=0, help="one sweep of this many points (goal 60 s)")
    args = ap.parse_args()
    if not slurm_answers():
        # `make bench` runs every benchmark: skip here, but CI has the cluster and must measure
        print("bench_submit: skipped, Slurm does not answer here (make cluster-up)", file=sys.stderr)
        return 2 if os.environ.get("CI", "").lower() == "true" else 0
    if args.huge:
        return huge(args.huge)
    small, large = args.small, args.large
    cmd_s: dict[int, list[float]] = {small: [], large: []}
    plan_s: dict[int, list[float]] = {small: [], large: []}
    submit_s: dict[int, list[float]] = {small: [], large: []}
    points: dict[int, int] = {}
    with tempfile.TemporaryDirectory(prefix="bench-submit-") as tmp:
        root = Path(tmp)
        uri = f"sqlite:///{root / 'mlruns.db'}"
        in_process(len(PARTITIONS), root, uri)  # warm-up: imports, Hydra, MLflow schema, sbatch
        command(len(PARTITIONS), root, uri)
        for _ in range(args.reps):
            for n in (small, large):  # side by side, alternating
                cmd_s[n].append(command(n, root, uri))
                p, s, points[n] = in_process(n, root, uri)
                plan_s[n].append(p)
                submit_s[n].append(s)
    med = statistics.median
    print(
        f"bench_submit: slurm_ci x train.seed, {len(PARTITIONS)} held job arrays per sweep (cancelled), "
        f"median of {args.reps}"
    )
    print(
        f"{'points':>7} {'command s':>10} {'| in process:':>13} {'plan s':>7} {'submit s':>9} {'ms/point':>9}"
    )
    for n in (small, large):
        inproc = med(plan_s[n]) + med(submit_s[n])
        print(
            f"{points[n]:>7} {med(cmd_s[n]):>10.2f} {'':>13} {med(plan_s[n]):>7.2f} {med(submit_s[n]):>9.2f} "
            f"{1000 * inproc / points[n]:>9.1f}"
        )
    r_cmd = med(cmd_s[large]) / med(cmd_s[small])
    r_plan = med(plan_s[large]) / med(plan_s[small])
    r_submit = med(submit_s[large]) / med(submit_s[small])
    r_inproc = (med(plan_s[large]) + med(submit_s[large])) / (med(plan_s[small]) + med(submit_s[small]))
    ok = r_cmd <= GOAL
    print(
        f"ratio {points[large]}/{points[small]} points: command {r_cmd:.2f} (goal <= {GOAL:g}: "
        f"{'met' if ok else 'NOT met'}); in process {r_inproc:.2f} (plan {r_plan:.2f}, submit {r_submit:.2f})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
