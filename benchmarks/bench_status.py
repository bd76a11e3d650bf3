"""`qualify status` of a 10,000-point Slurm sweep: goal under 2 s, one sacct and one squeue call.

The sweep is written the way `qualify sweep` writes it (manifest, point folders) in a temp
folder: 10 job arrays of 1,000 tasks (MaxArraySize 1001), 4,000 points accepted (outcome
files, already billed), 3,000 running, 1,000 between attempts (their stop records written, sacct
reading REQUEUED), 2,000 pending (sacct shows them as one pending range per array, as Slurm
does). Slurm's answers are recorded outputs in the exact formats asked for, served at the one
seam every client command goes through (`pipeline.slurm.commands.execute`); every call is
counted. Measured in process (the `qualify status` command's work: `cli.main`), median of the
repetitions, first poll (Slurm asked) and a second one within the interval (the shared cache).

Run: .venv/bin/python -m benchmarks.bench_status [--points 10000 --reps 3]
Exit 1 if the goal is missed (time, or more than one sacct/squeue call per poll).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

from pipeline import cli
from pipeline.contract.pointdir import PointDir, write_json
from pipeline.slurm import commands
from pipeline.slurm.job import sweep_job_name
from pipeline.submit import status
from pipeline.submit.billing import BILLED
from pipeline.submit.manifest import Manifest, PointEntry

ROOT = Path(__file__).resolve().parent.parent

GOAL_S = 2.0
SWEEP_ID = "20261130-120000-b10k"
ARRAY = 1000


def build(root: Path, n: int) -> tuple[str, str]:
    """The sweep on disk; (sacct, squeue) recorded answers."""
    sweep_dir = root / "runs" / SWEEP_ID
    name = sweep_job_name(SWEEP_ID)
    end = (datetime.now() - timedelta(seconds=120)).isoformat(timespec="seconds")
    stop_time = time.time() - 120
    points, sacct, squeue = [], [], []
    for i in range(n):
        job = f"{100 + i // ARRAY}_{i % ARRAY}"
        pdir = sweep_dir / "points" / f"p{i:05d}"
        points.append(
            PointEntry(
                f"p{i:05d}",
                i,
                [],
                f"cand{i % 12}",
                ("a100", "h100", "h200")[i % 3],
                "preempt",
                str(pdir),
                "fits",
                "a100x1",
                job,
            )
        )
        kind = i % 10
        if kind < 4:  # accepted
            point = PointDir(pdir).create()
            point.write_outcome({"point_id": f"p{i:05d}", "outcome": "accepted", "reason": "", "metrics": {}})
            write_json(pdir / BILLED, {"source": "sacct_final"})
            sacct.append(f"{job}|{name}|COMPLETED|{end}")
        elif kind < 7:  # running
            sacct.append(f"{job}|{name}|RUNNING|Unknown")
            squeue.append(f"{job}|{name}|RUNNING")
        elif kind < 8:  # between attempts
            point = PointDir(pdir).create()
            point.append_attempt({"start": stop_time - 60, "end": stop_time, "stop": "preempt"})
            point.write_stop({"reason": "preempt", "exit_time": stop_time})
            sacct.append(f"{job}|{name}|REQUEUED|{end}")
    for a in range(n // ARRAY):  # the pending tasks of each array: one range line, as Slurm prints them
        pending = [i % ARRAY for i in range(a * ARRAY, (a + 1) * ARRAY) if i % 10 >= 8]
        spec = ",".join(str(t) for t in pending)
        sacct.append(f"{100 + a}_[{spec}]|{name}|PENDING|Unknown")
        squeue.extend(f"{100 + a}_{t}|{name}|PENDING" for t in pending)
    m = Manifest(
        SWEEP_ID, "bench", "2026-11-30T12:00:00", "slurm", "", "bench", [], points=points, submitted=True
    )
    sweep_dir.mkdir(parents=True, exist_ok=True)
    m.write(sweep_dir)
    return "\n".join(sacct) + "\n", "\n".join(squeue) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        sacct, squeue = build(root, args.points)
        print(
            f"wrote a {args.points}-point sweep in {time.perf_counter() - t0:.1f} s "
            f"(sacct {len(sacct) // 1024} KiB, squeue {len(squeue) // 1024} KiB recorded)"
        )
        calls: list[str] = []

        def recorded(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
            calls.append(cmd[0])
            out = {"sacct": sacct, "squeue": squeue}.get(cmd[0])
            if out is None:
                raise AssertionError(f"unexpected Slurm call: {cmd}")
            return subprocess.CompletedProcess(cmd, 0, out, "")

        commands.execute = recorded  # type: ignore[assignment]
        argv = ["status", "--runs-dir", str(root / "runs"), "--sweep", SWEEP_ID]
        first, cached, text = [], [], ""
        for _ in range(args.reps):
            (root / "runs" / SWEEP_ID / status.STATUS_CACHE).unlink(missing_ok=True)
            for times in (first, cached):
                calls.clear()
                buf = io.StringIO()
                t = time.perf_counter()
                with contextlib.redirect_stdout(buf):
                    assert cli.main(argv) == 0
                times.append((time.perf_counter() - t, list(calls)))
                text = text or buf.getvalue()
        print(text.split("\n\nall")[0].split("\n", 2)[2])
        print("all" + text.split("\n\nall")[1].split("\n")[0])
        f_med = statistics.median(t for t, _ in first)
        c_med = statistics.median(t for t, _ in cached)
        f_calls, c_calls = first[0][1], cached[0][1]
        print(f"\nqualify status, {args.points} points, median of {args.reps}:")
        print(f"  first poll (asks Slurm)      {f_med:6.2f} s   Slurm calls: {f_calls}")
        print(f"  next poll within interval    {c_med:6.2f} s   Slurm calls: {c_calls}")
        print(f"  goal: < {GOAL_S:.0f} s with one accounting call; ratio first/goal {f_med / GOAL_S:.2f}")
        cache = json.loads((root / "runs" / SWEEP_ID / status.STATUS_CACHE).read_text())
        print(f"  shared cache: {len(cache['jobs'])} jobs")
        ok = f_med < GOAL_S and sorted(f_calls) == ["sacct", "squeue"] and c_calls == []
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
