"""Many jobs logging at once: N writer processes, each logging `--steps` metric steps through the
project's own tracking path (pipeline.tracking.ledger.Tracker: ledger first, batches in the
background), into a real `mlflow server` backed by PostgreSQL (the project's own,
cluster/postgres.sh) and, for comparison, by SQLite. Prints metrics expected against stored
(0 lost is the goal) and the wall time of each.

    .venv/bin/python -m benchmarks.bench_tracking_server [--writers 64] [--steps 1000] [--backends postgres,sqlite]

Exit code 1 when any metric is lost. Needs root or a PostgreSQL server install for the
postgres backend (bash cluster/postgres.sh install).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.support.tracking_server import KEYS, mlflow_server, postgres, run_writers, stored


def bench(backend: str, writers: int, steps: int) -> tuple[int, int, float]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o711)  # the server runs as the postgres user: it must reach work/pg/data
        if backend == "postgres":
            with postgres(work) as env, mlflow_server(work, "postgres", env, workers=4) as url:
                wall, ids = run_writers(url, work, writers, steps, "bench")
                got = stored(url, ids)
        else:
            with mlflow_server(work, f"sqlite:///{work / 'mlruns.db'}", workers=4) as url:
                wall, ids = run_writers(url, work, writers, steps, "bench")
                got = stored(url, ids)
    return writers * steps * len(KEYS), got, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--backends", default="postgres,sqlite")
    args = ap.parse_args()
    lost_any = False
    print(
        f"{'backend':<10} {'writers':>8} {'steps':>6} {'expected':>9} {'stored':>9} {'lost':>6} {'wall s':>8}"
    )
    for backend in args.backends.split(","):
        expected, got, wall = bench(backend, args.writers, args.steps)
        lost_any |= got != expected
        print(
            f"{backend:<10} {args.writers:>8} {args.steps:>6} {expected:>9} {got:>9} {expected - got:>6} {wall:>8.1f}"
        )
    return 1 if lost_any else 0


if __name__ == "__main__":
    raise SystemExit(main())
