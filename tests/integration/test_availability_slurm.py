"""Availability end to end on the local Slurm (issue #34): one partition made busy by blocker jobs
(sleep jobs holding all of its nodes' GPUs, submitted here and cancelled here), a sweep over the
fake partitions, then `qualify report project.*`: the busy partition shows the longer measured
queue wait (sacct, every attempt), each partition's `sbatch --test-only` start estimate for the
production job (dated), time to result with its band; and with a deadline the decision moves from
the cheapest partition to one that finishes in time."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.slurm_fixtures import mlflow_server, slurm_cluster  # noqa: F401
from tests.support.slurm_sweep import TINY, point_runs, qualify, sweep_id_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

EXPERIMENT = "availability"
# the production run: 8 GPUs (2 whole nodes of 4 on the fake partitions), a few CPU-minutes of
# training at the tiny model's pace here, and a deadline the busy partition cannot meet while
# its nodes are held for the next hour
TARGET = ["project.tokens=2e7", "project.gpus=8"]
DEADLINE = "project.deadline_h=0.5"


def _block(seconds: int, limit_min: int) -> str:
    """A job holding both a100 nodes' GPUs for `seconds`; its id."""
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", "a100", "-N", "2", "--gres=gpu:4", "--exclusive", "-J", "sq-test-blocker",
         "-o", "/dev/null",  # not a slurm-<id>.out in the folder the test runs from
         "-t", str(limit_min), f"--wrap=sleep {seconds}"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


@pytest.fixture
def blockers() -> Iterator[list[str]]:
    ids: list[str] = []
    try:
        yield ids
    finally:
        if ids:
            subprocess.run(["scancel", *ids], timeout=30, check=False)


def _winner(report: str) -> str:
    m = re.search(r"tiny x full: (\S+) wins", report)
    assert m, report[:3000]
    return m.group(1)


def test_a_busy_partition_waits_longer_and_a_deadline_moves_the_decision(
    tmp_path: Path,
    slurm_cluster: None,  # noqa: F811
    mlflow_server: str,  # noqa: F811
    blockers: list[str],
) -> None:
    blockers.append(_block(40, 2))  # the sweep's a100 job waits behind it
    runs = tmp_path / "runs"
    out = qualify(
        "sweep", "--sweep", "slurm_ci", "--wait", f"runs_dir={runs}", f"tracking.uri={mlflow_server}",
        f"tracking.experiment={EXPERIMENT}", *TINY, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    sweep_id = sweep_id_of(out.stdout)

    # measured: sacct's Eligible -> Start of every allocation, per partition
    waits = {
        r.data.params["partition.name"]: r.data.metrics.get("time/queue_wait_s")
        for r in point_runs(mlflow_server, EXPERIMENT, sweep_id)
    }
    assert set(waits) == {"ci_a100", "ci_h100", "ci_h200"}, waits
    assert all(w is not None for w in waits.values()), waits
    assert waits["ci_a100"] >= 15 > waits["ci_h100"], waits  # type: ignore[operator]

    # the queue now: a100 held for the next hour, so a 2-node job there starts in about an hour
    blockers.append(_block(3600, 60))
    report_dir = tmp_path / "report"
    common = [
        "report",
        "--sweep",
        sweep_id,
        "--tracking-uri",
        mlflow_server,
        "--experiment",
        EXPERIMENT,
        "--out",
    ]
    out = qualify(*common, str(report_dir / "plain"), *TARGET, timeout=300)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    plain = (report_dir / "plain" / "report.md").read_text()
    assert _winner(plain).startswith("ci_a100/"), "without a deadline the cheapest partition wins"
    section = plain.split("## Availability and time to result", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ci_")}
    assert "starts in 0.0 h" in rows["ci_h100"] and "2 node(s) x 4 GPUs" in rows["ci_h100"], rows
    a100_start = re.search(r"starts in ([\d.]+) h", rows["ci_a100"])
    assert a100_start and 0.8 <= float(a100_start.group(1)) <= 1.1, rows["ci_a100"]
    assert re.search(r"\| \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", rows["ci_a100"]), "the snapshot is dated"
    assert re.search(r"\| ci_a100/\S+ \| [\d.]+ h \| [\d.]+ h - [\d.]+ h \|", section), (
        "time to result and its band"
    )

    out = qualify(*common, str(report_dir / "deadline"), *TARGET, DEADLINE, timeout=300)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    timed = (report_dir / "deadline" / "report.md").read_text()
    winner = _winner(timed)
    assert not winner.startswith("ci_a100/"), "the busy partition cannot finish by the deadline"
    assert re.search(r"ci_a100/\S+: misses the 0.5 h deadline \(time to result", timed), timed[:4000]
    assert f"The cheapest candidate that meets the 0.5 h deadline: {winner}" in timed
