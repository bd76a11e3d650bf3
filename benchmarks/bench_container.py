"""The cost of running the ranks inside an image: the same point inside the local cluster's crun
bundle (partition=ci_oci: Slurm's own `srun --container`) and on the host (the same partition,
partition.container.kind=none), side by side in one sweep, REPEATS times each.

Printed: the tokens/s ratio inside / on the host (`perf/tokens_per_s`, medians; goal >= 0.98:
the bundle shares the host's network, /dev/shm and user space, so only the namespaces are new)
and the start-up ratio (`time/startup_s`, process start to a trainer ready to step, medians:
what the runtime adds before the first step; reported, no goal).

Measured here (2 cores; the four jobs of the sweep at once, beside other work, load average
about 13): tokens/s 6801 inside, 5918 on the host (ratio 1.149), start-up 168.5 s vs 168.6 s
(ratio 0.999): on a loaded machine the spread between runs exceeds the difference.

Needs the local cluster up (bash cluster/cluster.sh up: oci.conf, crun, the bundle).
Run: .venv/bin/python -m benchmarks.bench_container [--repeats 2] [--steps 30]
Exit 1 when the tokens/s goal is missed.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.tracking import keys as K

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.98


def run_sweep(work: Path, repeats: int, steps: int) -> tuple[str, str]:
    """One sweep of both placements (a `partition.container.kind` axis), each `repeats` times
    (seeds); returns (tracking URI, sweep id)."""
    uri = f"sqlite:///{work}/mlruns.db"
    seeds = ",".join(str(1234 + i) for i in range(repeats))
    args = [
        "sweep", "--sweep", "default", "--wait",
        "partition=ci_oci", "model=tiny", "precision=fp32", "parallelism=zero2", "drill=none",
        "partition.container.kind=oci,none", f"train.seed={seeds}", f"train.steps={steps}",
        f"runs_dir={work}/runs", f"tracking.uri={uri}",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=3600
    )
    if out.returncode != 0:
        sys.exit(f"the sweep failed:\n{out.stdout}\n{out.stderr}")
    m = re.search(r"sweep id: (\S+)", out.stdout)
    assert m, out.stdout
    return uri, m.group(1)


def figures(uri: str, sweep_id: str) -> dict[str, dict[str, list[float]]]:
    """placement (oci | none) -> metric -> the accepted runs' values."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("slurm-qualify")
    assert exp is not None
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{K.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{K.TAG_PARENT_KIND}` = 'point'",
    )
    out: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        tags, m = run.data.tags, run.data.metrics
        if tags.get(K.TAG_OUTCOME) != "accepted":
            print(f"  not accepted: {run.info.run_name}: {tags.get(K.TAG_REASON_DETAIL)}")
            continue
        placement = tags.get(K.TAG_CONTAINER, "none").split(":", 1)[0]
        if placement == "oci":
            assert tags.get(K.TAG_CONTAINER_INSIDE) == "yes", tags  # it really ran inside
        for key in (K.PERF_TOKENS_PER_S, K.TIME_STARTUP_S):
            if key in m:
                out.setdefault(placement, {}).setdefault(key, []).append(m[key])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-container-") as tmp:
        uri, sweep_id = run_sweep(Path(tmp), args.repeats, args.steps)
        got = figures(uri, sweep_id)
    if set(got) != {"oci", "none"}:
        print(f"missing a placement: {sorted(got)}")
        return 1
    med = {p: {k: statistics.median(v) for k, v in f.items()} for p, f in got.items()}
    tps = med["oci"][K.PERF_TOKENS_PER_S] / med["none"][K.PERF_TOKENS_PER_S]
    start = med["oci"][K.TIME_STARTUP_S] / med["none"][K.TIME_STARTUP_S]
    for p in ("oci", "none"):
        print(
            f"{'inside the bundle' if p == 'oci' else 'on the host':<18} tokens/s {med[p][K.PERF_TOKENS_PER_S]:8.0f}"
            f"   start-up {med[p][K.TIME_STARTUP_S]:6.2f} s   ({len(got[p][K.PERF_TOKENS_PER_S])} runs)"
        )
    print(f"tokens/s ratio inside/host {tps:.3f} (goal >= {GOAL})   start-up ratio inside/host {start:.3f}")
    return 0 if tps >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
