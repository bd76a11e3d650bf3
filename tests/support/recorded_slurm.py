"""Recorded Slurm answers for tests without a cluster (test_status_recorded, test_control):
the client commands answered from recordings at the one place they are started
(pipeline.slurm.commands.execute), sacct/squeue output in the formats they are asked for, and
a submitted sweep's folder with its manifest and outcomes."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta
from pathlib import Path

from pipeline.contract.pointdir import PointDir
from pipeline.slurm.job import sweep_job_name
from pipeline.submit.manifest import Manifest, PointEntry

SWEEP_ID = "20261130-120000-abcd"
NAME = sweep_job_name(SWEEP_ID)


class RecordedSlurm:
    """The Slurm client commands, answered from recordings: `answers[program]` is its stdout;
    a program in `hangs` does not answer in time, one in `fails` exits 1 with that stderr.
    Every command line is kept in `calls`."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.hangs: set[str] = set()
        self.fails: dict[str, str] = {}
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        program = cmd[0]
        if program in self.hangs:
            raise subprocess.TimeoutExpired(cmd, timeout_s)
        if program in self.fails:
            return subprocess.CompletedProcess(cmd, 1, "", self.fails[program])
        if program not in self.answers:
            raise AssertionError(f"no recording for {cmd}")
        return subprocess.CompletedProcess(cmd, 0, self.answers[program], "")

    def programs(self) -> list[str]:
        return [c[0] for c in self.calls]


def ended(seconds_ago: float) -> str:
    """sacct's End column: local time, to the second."""
    return (datetime.now() - timedelta(seconds=seconds_ago)).isoformat(timespec="seconds")


def sacct(*rows: tuple[str, str, str]) -> str:
    """`sacct -X -n -P -o JobID,JobName%200,State,End` output: (job id, state, end) rows of this
    sweep's jobs (the four fields of the releases before the queue wait was read: still read)."""
    return "".join(f"{job}|{NAME}|{state}|{end}\n" for job, state, end in rows)


def squeue(*rows: tuple[str, str]) -> str:
    """`squeue -h -r -o %i|%j|%T` output."""
    return "".join(f"{job}|{NAME}|{state}\n" for job, state in rows)


def make_sweep(tmp_path: Path, job_ids: list[str]) -> tuple[Path, Manifest]:
    sweep_dir = tmp_path / "runs" / SWEEP_ID
    points = [
        PointEntry(
            point_id=f"p{i:04d}",
            index=i,
            overrides=[],
            candidate=f"cand{i}",
            partition="a100" if i % 2 else "h100",
            drills="none",
            point_dir=str(sweep_dir / "points" / f"p{i:04d}"),
            mem_verdict="fits",
            group="a100x1",
            job_id=job,
        )
        for i, job in enumerate(job_ids)
    ]
    m = Manifest(
        SWEEP_ID,
        "smoke",
        "2026-11-30T12:00:00",
        "slurm",
        "",
        "slurm-qualify",
        [],
        points=points,
        submitted=True,
    )
    sweep_dir.mkdir(parents=True)
    m.write(sweep_dir)
    return sweep_dir, m


def outcome(entry: PointEntry, result: str, reason: str = "") -> dict:
    summary = {"point_id": entry.point_id, "outcome": result, "reason": reason, "detail": "", "metrics": {}}
    PointDir(entry.point_dir).write_outcome(summary)
    return summary
