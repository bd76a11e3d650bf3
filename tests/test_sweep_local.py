"""The embedded default, end to end: the real `qualify sweep` CLI on the local executor, every
point a child run in MLflow with its outcome, read back through the MLflow API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import point_runs, qualify

from pipeline.config.compose import compose_sweep
from pipeline.config.validate import memory_estimate

ACCEPTED_METRICS = [
    "perf/tokens_per_s",
    "perf/step_time_p50_s",
    "perf/step_time_p95_s",
    "perf/step_time_cv",
    "perf/mfu_vs_measured_ceiling",
    "mem/peak_rss_gib",
    "ckpt/save_s",
    "ckpt/load_s",
    "ckpt/bytes",
    "ckpt/verified",
]


@pytest.mark.slow
def test_default_sweep_end_to_end(tmp_path: Path, sqlite_uri: str) -> None:
    runs = tmp_path / "runs"
    res = qualify(
        [
            "sweep",
            "--sweep",
            "default",
            "--launcher",
            "local",
            f"runs_dir={runs}",
            f"tracking.uri={sqlite_uri}",
        ]
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.startswith("launcher: local"), "the launcher is said in one line at the start"
    assert "MLflow:" in res.stdout and "make ui" in res.stdout

    (sweep_dir,) = list(runs.iterdir())
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    children = point_runs(sqlite_uri)
    assert len(children) == len(manifest["points"]) == 7
    parent_ids = {r.data.tags["mlflow.parentRunId"] for r in children}
    assert parent_ids == {manifest["parent_run_id"]}

    by_precision: dict[str, list] = {}
    for r in children:
        by_precision.setdefault(r.data.params["precision.name"], []).append(r)
    for r in by_precision["fp16"]:
        assert r.data.tags["sq.outcome"] == "failed"
        assert r.data.tags["sq.reason"] == "unsupported_precision"
    for r in by_precision["fp32"] + by_precision["bf16"]:
        assert r.data.tags["sq.outcome"] == "accepted", (
            r.data.tags.get("sq.reason"),
            r.data.tags.get("sq.reason_detail"),
        )
        for key in ACCEPTED_METRICS:
            assert key in r.data.metrics, (r.data.tags["sq.point_id"], key)
        assert r.data.metrics["ckpt/verified"] == 1.0
        assert r.data.metrics["train/final_loss"] < r.data.metrics["train/loss_bound"]
        assert r.data.params["parallelism.zero_stage"] in {"1", "2", "3"}
        assert r.data.tags["sq.candidate"].startswith("local/tiny/")
    # the summary table names every point with its outcome
    for p in manifest["points"]:
        assert p["point_id"][:46] in res.stdout

    status = qualify(["status", "--runs-dir", str(runs)])
    assert status.returncode == 0
    assert "6/7" in status.stdout or "7/7" in status.stdout


def test_gpu_anchor_plans_with_memory_verdicts() -> None:
    """The real-cluster preset composes, and the memory model judges each point before any
    submission (does a 13B fit on 4 x 80 GB with ZeRO-2?)."""
    points = compose_sweep("gpu_anchor")
    assert len(points) == 3 * 2 * 2
    verdicts = {
        (p.cfg.partition.name, p.cfg.model.name, p.cfg.parallelism.zero_stage): memory_estimate(p.cfg).verdict
        for p in points
    }
    # ZeRO-3 over 4 GPUs shards the 16 bytes/param: 7B -> 28 GB of states per GPU, fits on 80 GB
    assert verdicts[("a100", "llama-7b", 3)] == "fits"
    # ZeRO-2 keeps 2 bytes/param of weights whole plus 14/4: 13B -> ~71 GB on an 80 GB A100
    assert verdicts[("a100", "llama-13b", 2)] == "does_not_fit"
    assert verdicts[("h200", "llama-13b", 3)] == "fits"


def test_show_lists_points_without_submitting(tmp_path: Path) -> None:
    res = qualify(["show", "--sweep", "smoke"])
    assert res.returncode == 0
    assert res.stdout.count("# p0000-local-tiny-full-fp32-zero2") == 1
