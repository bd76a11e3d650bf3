"""Availability end to end on the local Slurm (issue #34): one partition made busy by blocker jobs
(sleep jobs holding all of its nodes' GPUs, submitted here and cancelled here), a sweep over the
fake partitions, then `qualify report project.*`: the busy partition shows the longer measured
queue wait (sacct, every attempt), each partition's `sbatch --test-only` start for the
production job (dated), time to result with its band; and when the winner's partition is then
held for the next half hour, a deadline moves the decision to the runner-up.

The fake partitions share this machine's CPUs, so which one is cheapest is whatever their
measured throughput and start-up make it under the load of the moment (on a busy CI machine the
a100 point, priced lowest, has lost to h200): the test holds the partition that actually won."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.slurm_fixtures import mlflow_server, slurm_cluster  # noqa: F401
from tests.support.slurm_sweep import ONE_RANK, TINY, point_runs, qualify, sweep_id_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

EXPERIMENT = "availability"
# the production run: 8 GPUs (2 whole nodes of 4 on the fake partitions), a few CPU-minutes of
# training at the tiny model's pace here, and a deadline a partition cannot meet while its nodes
# are held for the next half hour (HOLD_MIN: every fake partition's MaxTime allows it)
TARGET = ["project.tokens=2e7", "project.gpus=8"]
HOLD_MIN = 30
DEADLINE_H = 0.4


def _block(partition: str, seconds: int, limit_min: int) -> str:
    """A job holding both of `partition`'s nodes' GPUs for `seconds`; its id."""
    out = subprocess.run(
        ["sbatch", "--parsable", "-p", partition, "-N", "2", "--gres=gpu:4", "--exclusive", "-J", "sq-test-blocker",
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
            # gone from the queue, not only cancelled: their nodes stay `completing` for seconds
            # (KillWait) after scancel, and the next test may read the nodes' state (sinfo)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                queued = subprocess.run(
                    ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30
                )
                if queued.returncode == 0 and not set(ids) & set(queued.stdout.split()):
                    break
                time.sleep(1)


def _winner(report: str) -> tuple[str, str]:
    """The decision's winner and runner-up."""
    m = re.search(r"tiny x full: (\S+) wins on .*?; runner-up (\S+) at", report)
    assert m, report[:3000]
    return m.group(1), m.group(2)


def _availability(report: str) -> dict[str, str]:
    """The availability table's row of each partition."""
    section = report.split("## Availability and time to result", 1)[1].split("\n## ", 1)[0]
    cells = [(line.split("|")[1].strip(), line) for line in section.splitlines() if line.startswith("| ci_")]
    return {name: line for name, line in cells if "/" not in name}  # not the candidates' table below it


def test_a_busy_partition_waits_longer_and_a_deadline_moves_the_decision(
    tmp_path: Path,
    slurm_cluster: None,  # noqa: F811
    mlflow_server: str,  # noqa: F811
    blockers: list[str],
) -> None:
    blockers.append(_block("a100", 40, 2))  # the sweep's a100 job waits behind it
    runs = tmp_path / "runs"
    out = qualify(
        "sweep", "--sweep", "slurm_ci", "--wait", f"runs_dir={runs}", f"tracking.uri={mlflow_server}",
        f"tracking.experiment={EXPERIMENT}", ONE_RANK, *TINY, timeout=600,
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

    # the queue now is empty: every partition starts the production job at once
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
    winner, runner_up = _winner(plain)
    rows = _availability(plain)
    assert set(rows) == {"ci_a100", "ci_h100", "ci_h200"}, rows
    for name, row in rows.items():
        assert "starts in 0.0 h" in row and "2 node(s) x 4 GPUs" in row, (name, row)
    assert re.search(r"\| ci_\w+/\S+ \| [\d.]+ h \| [\d.]+ h - [\d.]+ h \|", plain), (
        "time to result and its band"
    )

    # then the winner's partition is held for the next half hour: its production job starts then,
    # and a deadline it cannot meet moves the decision to the runner-up
    busy = winner.split("/", 1)[0]
    blockers.append(_block(busy.removeprefix("ci_"), HOLD_MIN * 60, HOLD_MIN))
    out = qualify(
        *common, str(report_dir / "deadline"), *TARGET, f"project.deadline_h={DEADLINE_H}", timeout=300
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    timed = (report_dir / "deadline" / "report.md").read_text()
    rows = _availability(timed)
    busy_start = re.search(r"starts in ([\d.]+) h", rows[busy])
    assert busy_start and 0.8 * HOLD_MIN / 60 <= float(busy_start.group(1)) <= 1.1 * HOLD_MIN / 60, rows[busy]
    assert re.search(r"\| \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", rows[busy]), "the snapshot is dated"
    for name in set(rows) - {busy}:
        assert "starts in 0.0 h" in rows[name], (name, rows[name])
    assert re.search(rf"{re.escape(winner)}: misses the {DEADLINE_H:g} h deadline \(time to result", timed), (
        timed[:4000]
    )
    assert f"The cheapest candidate that meets the {DEADLINE_H:g} h deadline: {runner_up}" in timed, timed[
        :4000
    ]
    assert _winner(timed)[0] == runner_up, "the decision moved to the runner-up"
