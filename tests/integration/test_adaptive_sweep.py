"""sweep.adaptive=true through the CLI, as a user runs it: a real local sweep of two tiny
candidates (ZeRO-1 and ZeRO-2, a few steps each). Round 1 runs one repeat of each; the rounds
that follow add points (same candidate, next seed) only for the candidates still in contention,
into the same sweep folder, manifest and parent run; the report states the GPU-hours spent and
those of the full grid."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.support.helpers import point_runs, qualify


@pytest.mark.slow
@pytest.mark.long(124)
def test_adaptive_rounds_on_a_real_local_sweep(tmp_path: Path, sqlite_uri: str) -> None:
    runs = tmp_path / "runs"
    res = qualify(
        ["sweep", "--sweep", "smoke", "--launcher", "local", f"runs_dir={runs}", f"tracking.uri={sqlite_uri}",
         "parallelism=zero1,zero2", "sweep.adaptive=true", "sweep.repeats=2", "train.steps=30",
         "train.measure_comm=false", "train.measure_ceiling=false"],
        timeout=1200,
    )  # fmt: skip
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "[adaptive] round 1: one repeat of every point; at most 2 per candidate" in out
    line = re.search(r"\[adaptive\] (\d) round\(s\); ended: (.*); in contention: (.*); GPU-hours spent (\S+), "
                     r"the full grid would have spent (\S+)", out)  # fmt: skip
    assert line is not None, out[-4000:]
    rounds, spent, full = int(line.group(1)), float(line.group(4)), float(line.group(5))
    sweep_dir = next(runs.iterdir())
    points = json.loads((sweep_dir / "manifest.json").read_text())["points"]
    # round 1: 2 points; round 2 only if the two were not separated, then one more of each
    assert rounds in (1, 2) and len(points) == 2 * rounds
    if rounds == 1:  # round 2 runs only when round 1 did not separate them; it may or may not
        assert "one candidate is left" in line.group(2), line.group(0)
    assert [p["index"] for p in points] == list(range(len(points)))
    for p in points[2:]:
        assert p["overrides"][-1] == "train.seed=1235"  # the next seed of its candidate (the default 1234)
        assert (Path(p["point_dir"]) / "outcome.json").exists()
    # every point's run is a child of the one parent run, which counts them all
    children = point_runs(sqlite_uri)
    assert len(children) == len(points)
    parents = {r.data.tags.get("mlflow.parentRunId") for r in children}
    assert len(parents) == 1
    parent = MlflowClient(sqlite_uri).get_run(parents.pop() or "")
    assert parent.data.tags["sq.adaptive"] == "2" and parent.data.tags["sq.points"] == str(len(points))
    hours = [r.data.metrics["cost/gpu_hours"] for r in children]
    assert spent == pytest.approx(sum(hours), rel=1e-2)
    by_cand: dict[str, list[float]] = {}
    for r in children:
        by_cand.setdefault(r.data.tags["sq.candidate"], []).append(r.data.metrics["cost/gpu_hours"])
    assert full == pytest.approx(sum(2 * sum(v) / len(v) for v in by_cand.values()), rel=1e-2)
    rep = qualify(["report", "--sweep", sweep_dir.name, "--tracking-uri", sqlite_uri, "--out", str(tmp_path / "rep"),
                   "--no-attach", "--no-tag-runs"])  # fmt: skip
    assert rep.returncode == 0, rep.stdout[-3000:] + rep.stderr[-3000:]
    md = "\n".join(p.read_text() for p in (tmp_path / "rep").glob("*.md"))
    assert "Adaptive qualification (sweep.adaptive, at most 2 repeats a candidate)" in md, md[:3000]
    assert f"over {len(points)} run(s)" in md
