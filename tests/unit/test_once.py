"""Facts computed or written once (issue 35): the memory model once per point on its way to
submission, carried on the planned point; and in `submit()` each point's config written once
and the manifest once per real change (local: once before the points run, then each point's
job id as it starts), on a fake executor (no job runs)."""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import pipeline.config.validate as V
from pipeline.contract import pointdir, sweepdir
from pipeline.submit import sweep as S

POINTS = ["precision=fp32,bf16", "parallelism=zero1,zero2"]


def _count_estimates(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every estimate of a point's own query (the advice's what-ifs are other queries)."""
    calls: Counter[str] = Counter()
    real_query, real_estimate = V.memory_query, V.estimate

    def query(cfg: Any, on_gpu: Any = None) -> Any:
        calls["query"] += 1
        return real_query(cfg, on_gpu)

    def estimate(q: Any) -> Any:
        calls["estimate"] += 1
        return real_estimate(q)

    monkeypatch.setattr(V, "memory_query", query)
    monkeypatch.setattr(V, "estimate", estimate)
    return calls


def test_planning_a_sweep_estimates_each_point_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_estimates(monkeypatch)
    pl = S.plan("smoke", [*POINTS, f"runs_dir={tmp_path}"], launcher_kind="local")
    assert len(pl.points) == 4
    assert calls == {"query": 4, "estimate": 4}, calls
    for p, entry in zip(pl.points, pl.manifest.points, strict=True):
        assert p.memory is not None and entry.mem_verdict == p.memory.verdict  # carried, not recomputed


class _Job:
    def __init__(self, n: int) -> None:
        self.job_id = f"local-{n}"

    def done(self) -> bool:
        return True

    def results(self) -> list[dict[str, Any]]:
        return [{}]


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every write of a point's or the sweep's files, by file name (pipeline/files.py's writers
    as the point and sweep folders call them)."""
    writes: Counter[str] = Counter()
    for module in (pointdir, sweepdir):
        for name in ("write_atomic", "write_json"):
            real = getattr(module, name, None)
            if real is None:
                continue

            def counted(path: Any, *a: Any, _real: Any = real, **k: Any) -> None:
                writes[Path(path).name] += 1
                _real(path, *a, **k)

            monkeypatch.setattr(module, name, counted)
    return writes


def _planned(tmp_path: Path) -> S.Plan:
    # a port that refuses at once: the sweep goes on offline (its runs in ledgers), no MLflow here
    overrides = [*POINTS, f"runs_dir={tmp_path}", "tracking.uri=http://127.0.0.1:9"]
    return S.plan("smoke", overrides, launcher_kind="local")


def test_submit_writes_each_config_once_and_the_manifest_once_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pl = _planned(tmp_path)
    writes = _count_writes(monkeypatch)
    jobs = iter(range(100))
    executor = SimpleNamespace(submit=lambda fn: _Job(next(jobs)))
    monkeypatch.setattr(S, "local_executor", lambda folder, cfg, python=None: executor)
    monkeypatch.setattr(S, "warm_ranks", lambda folder: contextlib.nullcontext(None))  # no rank runs
    S.submit(pl)
    n = len(pl.points)
    assert writes[pointdir.PointDir.CONFIG] == n, writes  # once per point, by the login node
    # once complete before the points run, once per point as its job starts, once at the end
    assert writes[sweepdir.SweepDir.MANIFEST] == 1 + n + 1, writes
    assert [e.job_id for e in S.Manifest.read(pl.sweep_dir).points] == [f"local-{i}" for i in range(n)]


class _Batch:
    """submitit's executor for one Slurm array: `batch()` then `submit` per point."""

    def __init__(self, ids: Any) -> None:
        self.ids = ids

    @contextlib.contextmanager
    def batch(self) -> Any:
        yield

    def submit(self, fn: Any) -> _Job:
        return _Job(next(self.ids))


def test_a_slurm_sweep_writes_its_manifest_before_sbatch_and_once_with_the_job_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before sbatch (queued jobs of a login node that died stay findable), then once more: the
    job ids exist only after it. No sbatch runs: the executor is a fake."""
    from pipeline.slurm import cluster

    pl = _planned(tmp_path)
    pl.launcher = pl.manifest.launcher = "slurm"
    writes = _count_writes(monkeypatch)
    ids = iter(range(100))
    monkeypatch.setattr(cluster, "max_array_size", lambda **_: 1000)
    monkeypatch.setattr(S, "slurm_executor", lambda *a, **k: _Batch(ids))
    S.submit(pl)
    assert writes[pointdir.PointDir.CONFIG] == len(pl.points), writes
    assert writes[sweepdir.SweepDir.MANIFEST] == 2, writes
    m = S.Manifest.read(pl.sweep_dir)
    assert m.submitted and sorted(e.job_id for e in m.points) == [f"local-{i}" for i in range(len(pl.points))]
