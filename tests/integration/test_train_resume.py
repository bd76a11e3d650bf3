"""Real 2-rank DeepSpeed runs (gloo, CPU), started the way srun starts ranks.

Train 10 steps and save; a new process resumes to 20; the losses equal an uninterrupted
20-step run bit for bit (torch AdamW). Read back through the MLflow API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.contract.pointdir import PointDir
from tests.support.helpers import fp16_ending, launch_ranks, loss_history, point_runs, write_spec

pytestmark = pytest.mark.slow

BASE = [
    "model=tiny",
    "precision=fp32",
    "drill=none",
    "train.measure_comm=false",
    "train.measure_ceiling=false",
]


def run(tmp: Path, point_dir: Path, overrides: list[str], uri: str, point_id: str) -> dict:
    spec = write_spec(tmp, point_dir, overrides, uri, point_id)
    results = launch_ranks(spec)
    assert (point_dir / "outcome.json").exists(), results[0].stdout[-4000:]
    outcome = json.loads((point_dir / "outcome.json").read_text())
    for r in results:  # `python -m pipeline.job.entry` exits 0 exactly when the run is accepted
        assert (r.returncode == 0) == (outcome["outcome"] == "accepted"), r.stdout[-4000:]
    return outcome


@pytest.mark.long(112)
@pytest.mark.parametrize("zero", ["zero1", "zero3"])
def test_resume_is_bit_exact(tmp_path: Path, sqlite_uri: str, zero: str) -> None:
    full = run(
        tmp_path, tmp_path / "full", [*BASE, f"parallelism={zero}", "train.steps=20"], sqlite_uri, "full"
    )
    assert full["outcome"] == "accepted", full
    first = run(
        tmp_path, tmp_path / "split", [*BASE, f"parallelism={zero}", "train.steps=10"], sqlite_uri, "split"
    )
    assert first["metrics"]["train/steps_done"] == 10
    # the point runs on (as `qualify resume` makes it): an ended point's next allocation would
    # otherwise leave its final outcome alone and do nothing
    PointDir(tmp_path / "split").clear_outcome()
    second = run(
        tmp_path, tmp_path / "split", [*BASE, f"parallelism={zero}", "train.steps=20"], sqlite_uri, "split"
    )
    assert second["outcome"] == "accepted", second

    runs = {r.data.tags["sq.point_id"]: r for r in point_runs(sqlite_uri, "slurm-qualify")}
    assert set(runs) == {"full", "split"}, "the resumed attempt must log into the same MLflow run"
    ref = loss_history(sqlite_uri, runs["full"].info.run_id)
    resumed = loss_history(sqlite_uri, runs["split"].info.run_id)
    assert sorted(ref) == list(range(1, 21))
    assert resumed == ref  # bit for bit: float equality of every step's loss
    assert ref[20] < ref[1] * 0.9, "the synthetic task must be learnable"
    assert runs["split"].data.metrics["run/attempts"] == 2
    assert runs["split"].data.tags["sq.outcome"] == "accepted"


def test_checkpoint_drill_round_trip_verified_and_logged(tmp_path: Path, sqlite_uri: str) -> None:
    out = run(
        tmp_path,
        tmp_path / "ck",
        ["model=tiny", "precision=fp32", "parallelism=zero2", "drill=checkpoint", "train.steps=12"],
        sqlite_uri,
        "ck",
    )
    assert out["outcome"] == "accepted", out
    (run_,) = point_runs(sqlite_uri)
    m = run_.data.metrics
    assert m["ckpt/verified"] == 1.0
    assert m["ckpt/verified_count"] == 2  # the drill's round trip and the final one
    assert m["ckpt/bytes"] > 0 and m["ckpt/save_s"] > 0 and m["ckpt/load_s"] > 0
    assert 0 < m["ckpt/stall_s"] < m["ckpt/save_s"], "the loop waits for the host copy, not the commit"
    for part in ("import_s", "process_group_s", "model_build_s", "engine_init_s", "ckpt_load_s"):
        assert m[f"startup/{part}"] > 0, part
    parts = ("import_s", "process_group_s", "model_build_s", "engine_init_s")  # disjoint, in order
    assert sum(m[f"startup/{p}"] for p in parts) < m["time/startup_s"]  # process start to engine ready
    for key in (
        "perf/tokens_per_s",
        "perf/step_time_p50_s",
        "perf/step_time_p95_s",
        "perf/step_time_cv",
        "perf/mfu_vs_measured_ceiling",
        "mem/peak_rss_gib",
        "comm/allreduce_busbw_gbps",
        "cost/usd_run",
        "time/goodput",
    ):
        assert key in m, key
    assert m["perf/step_time_p95_s"] >= m["perf/step_time_p50_s"]
    assert "perf/mfu" not in m, "no datasheet peak for a CPU: no catalog MFU, never a guessed one"
    from mlflow.tracking import MlflowClient

    artifacts = {a.path for a in MlflowClient(sqlite_uri).list_artifacts(run_.info.run_id)}
    assert {"config.yaml", "ds_config.json"} <= artifacts
    ds = json.loads((tmp_path / "ck" / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2


def test_fp16_on_cpu_is_unsupported_not_a_crash(tmp_path: Path, sqlite_uri: str) -> None:
    """fp16 on a CPU is a result either way, never a crash: unsupported_precision where DeepSpeed
    has no fp16 kernels for it, a trained and accepted run where it has (AVX512-FP16)."""
    expected = fp16_ending()
    out = run(
        tmp_path, tmp_path / "fp16", ["model=tiny", "precision=fp16", "train.steps=5"], sqlite_uri, "fp16"
    )
    assert out["outcome"] == expected.outcome, out
    assert out["reason"] == expected.reason
    (run_,) = point_runs(sqlite_uri)
    assert run_.info.status == expected.status
    if expected.outcome == "failed":
        assert "fp16" in out["detail"]
        assert run_.data.tags["sq.reason"] == "unsupported_precision"
    else:
        assert run_.data.params["precision.name"] == "fp16" and run_.data.metrics["train/steps_done"] == 5
