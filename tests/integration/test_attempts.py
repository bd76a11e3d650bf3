"""Labor is charged for a point that failed for good, through the real CLI (the 4-rank
killed-worker drill that recovers, with no labor, is in tests/integration/test_drills.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.helpers import point_runs, qualify

KILL = [
    "model=tiny",
    "precision=fp32",
    "parallelism=zero2",
    "train.measure_comm=false",
    "train.measure_ceiling=false",
    "drill=kill_worker",
    "drill.reference=false",
    "train.checkpoint_interval=5",
]


def _sweep(tmp_path: Path, overrides: list[str]) -> tuple[dict, dict, list[dict], str]:
    """One point through the real CLI on the local executor: its MLflow metrics and tags, its
    attempt records, the CLI's output."""
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    args = ["sweep", "--sweep", "smoke", "--launcher", "local", "--wait", f"runs_dir={tmp_path / 'runs'}"]
    res = qualify([*args, f"tracking.uri={uri}", *KILL, *overrides], timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = point_runs(uri)
    (point_dir,) = list((tmp_path / "runs").glob("*/points/*"))
    attempts = json.loads((point_dir / "attempts.json").read_text())
    return run.data.metrics, run.data.tags, attempts, res.stdout


@pytest.mark.slow
def test_a_point_failed_for_good_is_charged_labor(tmp_path: Path) -> None:
    """No restart allowed: the killed worker ends the point for good (a crash that needs a
    person). Rank 0, the stop's writer, records the one attempt and charges 0.5 h x $120."""
    m, tags, attempts, stdout = _sweep(
        tmp_path, ["launcher.max_restarts=0", "drill.kill_worker.at_step=3", "train.steps=8"]
    )
    assert (tags["sq.outcome"], tags["sq.reason"]) == ("failed", "crash"), stdout[-2000:]
    assert "workers failed more than 0 times" in tags["sq.reason_detail"]
    assert len(attempts) == 1 and attempts[0]["needed_person"] is True
    assert m["cost/failures_needing_person"] == 1
    assert m["cost/usd_labor"] == pytest.approx(0.5 * 120.0)  # conf/cost/default.yaml
