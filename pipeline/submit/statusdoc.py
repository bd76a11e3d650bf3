"""`qualify status --json`: the status table's content as one JSON document for dashboards and
CI, one object per point and one per partition. Its keys are stable (docs/design.md, "Status
for scripts"); a change of their meaning bumps STATUS_FORMAT. A value that is not known (not
measured yet, not asked, not defined) is null, never 0."""

from __future__ import annotations

import statistics
import time
from typing import Any

from pipeline.submit.manifest import Manifest
from pipeline.submit.names import point_names
from pipeline.submit.status import FINAL, TABLE_COLUMNS, PointState, PointStatus, sweep_eta
from pipeline.tracking import keys as K

STATUS_FORMAT = 1
"""The document's layout; scripts check it before they read."""
POINT_METRICS = (
    K.PERF_TOKENS_PER_S,
    K.PERF_STEP_P50_S,
    K.PERF_STEP_CV,
    K.PERF_MFU,
    K.PERF_MFU_VS_CEILING,
    K.MEM_PEAK_ALLOCATED_GIB,
    K.MEM_PEAK_RSS_GIB,
    K.CKPT_SAVE_S,
    K.CKPT_LOAD_S,
    K.CKPT_VERIFIED,
)
"""The summary table's numbers, by their MLflow keys (pipeline/tracking/keys.py), for each point
whose outcome holds them."""


def _point(s: PointState, name: str) -> dict[str, Any]:
    out = s.outcome or {}
    metrics = out.get("metrics") or {}
    return {
        "point_id": s.entry.point_id,
        "name": name,
        "partition": s.entry.partition,
        "candidate": s.entry.candidate,
        "job_id": s.entry.job_id or None,
        "state": str(s.state),
        "final": s.state in FINAL,
        "reason": out.get("reason") or None,
        "detail": out.get("detail") or None,
        "attempts": s.attempts,
        "queue_wait_s": s.queue_wait_s,
        "metrics": {k: metrics[k] for k in POINT_METRICS if isinstance(metrics.get(k), int | float)},
    }


def _partition(name: str, states: list[PointState]) -> dict[str, Any]:
    waits = [s.queue_wait_s for s in states if s.queue_wait_s is not None]
    return {
        "partition": name,
        "points": len(states),
        "counts": {str(c): sum(s.state == c for s in states) for c in (*TABLE_COLUMNS, PointStatus.UNKNOWN)},
        "finished": sum(s.state in FINAL for s in states),
        "queue_wait_median_s": statistics.median(waits) if waits else None,
        "queue_waits": len(waits),
    }


def status_document(m: Manifest, states: list[PointState], now: float | None = None) -> dict[str, Any]:
    """The status of a sweep: what `qualify status` prints, as data."""
    names = point_names([s.entry for s in states])
    parts = sorted({s.entry.partition for s in states})
    eta = sweep_eta(states, time.time() if now is None else now)
    return {
        "format": STATUS_FORMAT,
        "sweep_id": m.sweep_id,
        "sweep": m.sweep,
        "launcher": m.launcher,
        "not_submitted": m.error or None,
        "points_total": len(states),
        "points_ended": sum(s.state in FINAL for s in states),
        "done": bool(states) and all(s.state in FINAL for s in states),
        "eta_s": eta.seconds,
        "eta_how": eta.how,
        "partitions": [_partition(p, [s for s in states if s.entry.partition == p]) for p in parts],
        "points": [_point(s, n) for s, n in zip(states, names, strict=True)],
    }
