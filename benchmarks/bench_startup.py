"""Start-up of a rank against its budget, and the first point of a sweep against the others.

1. The budget (docs/design.md, "Start-up"): a restart of the tiny model, process start to
   engine ready (`restart/start_to_ready_s`), at most 5 s on an idle machine: the median of
   RESTART_REPEATS restarts (the smoke point with a preemption drill on the local executor,
   `sweep.repeats=RESTART_REPEATS`, one at a time, a fresh SQLite store), printed with their
   spread; each phase of every restarted attempt (`startup/*_s`, step 1) is printed against its
   share of the budget, through MLflow.
   Beside it, in the same run, the floor: `benchmarks/startup_floor.py` on as many ranks, a
   bare interpreter doing only the imports and steps a job cannot skip (torch, transformers,
   DeepSpeed, the process group, the model from the point's own config, `deepspeed.initialize`
   with the point's own DeepSpeed config), started FLOOR_REPEATS times right after the sweep;
   printed: the restarts' median start_to_ready / the floor's median, both medians of as many
   starts, with each side's spread (goal <= FLOOR_GOAL on an idle machine). A ratio of one
   sample of each once read 1.18 or 1.25 from run-to-run noise alone.
2. `--sweep default`: the first point's `time/startup_s` (process start to a trainer ready
   to step) over the median of the others (goal <= 1.2): the first job of a sweep used to pay
   for what later ones reuse (DeepSpeed's C++ ops, now built at install by
   scripts/prebuild_ops.py; cold imports).

Run: .venv/bin/python -m benchmarks.bench_startup [--only budget|first] [--sweep default] [ARGS...]
Exit 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.2
FLOOR_GOAL = 1.15  # restart/start_to_ready_s over the floor's, idle machine
FLOOR_REPEATS = 3  # floor starts right after the sweep; their median is the floor
RESTART_REPEATS = 3  # restarts of the job (one per repeat of the smoke point); their median is compared
BUDGET_S = 5.0  # restart/start_to_ready_s of the tiny model, idle machine
# each phase's share of it (they do not add up to start_to_ready: probes run between them)
PHASES = {
    "startup/import_s": 3.0,  # interpreter, unpickling, torch, DeepSpeed (and MLflow on rank 0)
    "startup/process_group_s": 0.5,
    "startup/model_build_s": 0.5,
    "startup/engine_init_s": 0.7,
    "startup/ckpt_load_s": 0.3,
}


def sweep_runs(tmp: str, options: list[str], overrides: list[str], warm: bool = False) -> list[Any]:
    """Run a sweep as a user does and return its point runs (MLflow); cold ranks unless `warm`
    (a partition's jobs start as processes; warm local ranks: benchmarks/bench_warm.py)."""
    uri = f"sqlite:///{tmp}/mlruns.db"
    cmd = [sys.executable, "-m", "pipeline.cli", "sweep", *options, "--wait"]
    cmd += [
        f"runs_dir={tmp}/runs",
        f"tracking.uri={uri}",
        f"launcher.warm_ranks={str(warm).lower()}",
        *overrides,
    ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise SystemExit(f"bench_startup: the sweep failed\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("slurm-qualify")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], "tags.`sq.kind` = 'point'", max_results=1000)
    return [(client, r) for r in runs]


def floor_once(model_dir: Path, ds_config: Path, world_size: int) -> dict[str, float]:
    """One start of benchmarks/startup_floor.py on `world_size` local ranks: rank 0's figures."""
    from pipeline.job.distributed import free_port

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.update(WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    cmd = [sys.executable, "-m", "benchmarks.startup_floor", str(model_dir), str(ds_config)]
    ranks = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(world_size)
    ]
    out = [p.communicate(timeout=600)[0] for p in ranks]
    if any(p.returncode for p in ranks):
        raise SystemExit(f"bench_startup: the floor's ranks failed: {[p.returncode for p in ranks]}")
    return dict(json.loads(out[0].strip().splitlines()[-1]))


def point_files(tmp: str) -> tuple[Path, Path, int]:
    """The smoke point's model (its config.json, written from the point's config) and its
    DeepSpeed config, and its ranks."""
    from pipeline.config.resolved import config_from_yaml
    from pipeline.train.model import hf_config

    point = sorted(Path(tmp, "runs").glob("*/points/*"))[0]  # the repeats differ only in their seed
    cfg = config_from_yaml((point / "config.yaml").read_text())
    model_dir = Path(tmp, "floor-model")
    hf_config(cfg.model).save_pretrained(model_dir)
    return model_dir, point / "ds_config.json", cfg.parallelism.nodes * cfg.parallelism.gpus_per_node


def floor(model_dir: Path, ds_config: Path, world_size: int, n: int) -> list[dict[str, float]]:
    return [floor_once(model_dir, ds_config, world_size) for _ in range(n)]


def spread(values: list[float]) -> str:
    """The values, their median and their range (max - min) relative to it."""
    med = statistics.median(values)
    rel = (max(values) - min(values)) / med if med else float("nan")
    return f"{'  '.join(f'{v:6.2f}' for v in values)} s   median {med:.2f} s, spread {rel:.0%}"


def budget(overrides: list[str]) -> bool:
    """The restarted attempts' phases and start-to-ready against the budget, and against the
    floor measured beside them: the median of RESTART_REPEATS restarts over the floor's median."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        drill = ["drill=preempt", "drill.preempt.trigger=local", "train.steps=20", "drill.reference=false"]
        repeats = [f"sweep.repeats={RESTART_REPEATS}", "launcher.local_parallelism=1"]
        runs = sweep_runs(tmp, ["--sweep", "smoke", "--launcher", "local"], [*drill, *repeats, *overrides])
        history = {
            r.info.run_id: {k: client.get_metric_history(r.info.run_id, k) for k in PHASES}
            for client, r in runs
        }
        model_dir, ds_config, world = point_files(tmp)
        floors = floor(model_dir, ds_config, world, FLOOR_REPEATS)
    print(
        f"bench_startup: {len(runs)} restarts of the tiny model (smoke sweep, preempt drill, local executor, "
        "one at a time), rank 0"
    )
    for key, value in sorted(runs[0][1].data.tags.items()):
        if key.startswith("sq.startup."):
            print(f"  {key}: {value}")
    for key, share in PHASES.items():
        restarted = [m.value for h in history.values() for m in h[key] if m.step == 1]
        print(
            f"  {key:<26} budget {share:4.1f} s   restarts: {spread(restarted) if restarted else 'not measured'}"
        )
    ready = [
        r.data.metrics["restart/start_to_ready_s"]
        for _, r in runs
        if "restart/start_to_ready_s" in r.data.metrics
    ]
    if len(ready) < len(runs):
        print(
            "  restart/start_to_ready_s was not measured by every point (a drill did not restart)",
            file=sys.stderr,
        )
        return False
    med = statistics.median(ready)
    ok = med <= BUDGET_S
    print(
        f"  restart/start_to_ready_s   {spread(ready)}   (budget <= {BUDGET_S:g} s: {'met' if ok else 'NOT met'})"
    )
    return floor_ratio(med, floors) and ok


def floor_ratio(ready: float, floors: list[dict[str, float]]) -> bool:
    """The restarts' median start to ready over the floor's (the median of its starts), with the parts."""
    print(
        f"  the floor (benchmarks/startup_floor.py, {len(floors)} starts; the same model, DeepSpeed config, ranks):"
    )
    for key in ("import_s", "process_group_s", "model_build_s", "engine_init_s", "start_to_ready_s"):
        print(f"    {key:<18} {spread([f[key] for f in floors])}")
    base = statistics.median(f["start_to_ready_s"] for f in floors)
    ratio = ready / base
    met = ratio <= FLOOR_GOAL
    print(
        f"  median start_to_ready / the floor's median = {ready:.2f} / {base:.2f} = {ratio:.2f} "
        f"(goal <= {FLOOR_GOAL:g}: {'met' if met else 'NOT met'})"
    )
    return met


def first_point(sweep: str, overrides: list[str]) -> bool:
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        runs = sweep_runs(tmp, ["--sweep", sweep], overrides)
    startup = {
        r.data.tags["sq.point_id"]: r.data.metrics["time/startup_s"]
        for _, r in runs
        if "time/startup_s" in r.data.metrics
    }
    if len(startup) < 3:
        print(f"bench_startup: only {len(startup)} points measured their start-up", file=sys.stderr)
        return False
    first, *others = [startup[k] for k in sorted(startup)]
    median = statistics.median(others)
    ratio = first / median
    print(f"bench_startup: sweep '{sweep}', {len(startup)} points with time/startup_s (MLflow)")
    for k in sorted(startup):
        print(f"  {k:<60} {startup[k]:7.2f} s")
    print(
        f"first point {first:.2f} s / median of the other {len(others)} {median:.2f} s = {ratio:.2f} "
        f"(goal <= {GOAL:g}: {'met' if ratio <= GOAL else 'NOT met'})"
    )
    return ratio <= GOAL


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default="default")
    ap.add_argument("--only", choices=("budget", "first"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    ok = True
    if args.only != "first":
        ok = budget(args.overrides) and ok
    if args.only != "budget":
        ok = first_point(args.sweep, args.overrides) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
