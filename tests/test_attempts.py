"""One attempt record per attempt on more than two ranks, and the point's goodput, cost and
restart count from those records: a real 4-rank killed-worker drill through the CLI (4 gloo
ranks of the tiny model on the local executor), checked against a hand computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import point_runs, qualify

PRICE = 0.05  # conf/partition/local.yaml, USD per rank-hour
STORAGE_USD_PER_GB_MONTH, KEEP_LAST = 0.023, 2  # conf/cost/default.yaml, train.keep_last default


@pytest.mark.slow
def test_four_rank_kill_worker_records_two_attempts(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            "--wait",
            f"runs_dir={tmp_path / 'runs'}",
            f"tracking.uri={uri}",
            "model=tiny",
            "precision=fp32",
            "parallelism=zero2",
            "parallelism.gpus_per_node=4",
            "train.measure_comm=false",
            "train.measure_ceiling=false",
            "drill=kill_worker",
            "drill.kill_worker.rank=2",  # neither rank 0 (writer) nor rank 1 (its stand-in)
            "drill.kill_worker.at_step=7",
            "drill.reference=false",
            "train.checkpoint_interval=5",
            "train.steps=12",
        ],
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = point_runs(uri)
    m, tags = run.data.metrics, run.data.tags
    assert tags["sq.outcome"] == "accepted", (tags.get("sq.reason_detail"), res.stdout[-2000:])
    (point_dir,) = list((tmp_path / "runs").glob("*/points/*"))
    attempts = json.loads((point_dir / "attempts.json").read_text())

    # exactly one record per attempt: the killed one and the one that finished
    assert len(attempts) == 2, attempts
    assert m["run/attempts"] == 2
    assert [a.get("stop") for a in attempts] == ["peer_failure", None]  # one restart, for the kill
    assert [a["ranks"] for a in attempts] == [4, 4]
    assert tags["sq.allocated_source"] == "process_clock"  # no Slurm: labelled so

    # goodput by hand from the records: (productive - redone) / allocated, summed over attempts
    allocated = sum(a["allocated_s"] for a in attempts)
    productive = sum(a["productive_s"] - a.get("lost_s", 0.0) for a in attempts)
    assert m["time/allocated_s"] == pytest.approx(allocated, rel=1e-9)
    assert m["time/goodput"] == pytest.approx(productive / allocated, rel=1e-9)

    # cost by hand: 4 ranks x each attempt's hours x $0.05 + storage of keep_last checkpoints
    # (30 days of 30) + no egress, orchestration, labor (the requeue recovered by itself)
    compute = sum(4 * a["allocated_s"] / 3600 * PRICE for a in attempts)
    storage = STORAGE_USD_PER_GB_MONTH * m["ckpt/bytes"] * KEEP_LAST / 1e9
    assert m["cost/usd_compute"] == pytest.approx(compute, rel=1e-9)
    assert m["cost/usd_labor"] == 0.0
    assert m["cost/usd_run"] == pytest.approx(compute + storage, rel=1e-9)
