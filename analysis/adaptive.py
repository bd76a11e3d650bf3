"""The report's line on an adaptive sweep (`sweep.adaptive=true`, pipeline/submit/adaptive.py):
the GPU-hours its rounds spent and those the full grid (every candidate x the most repeats,
each run at its candidate's mean measured GPU-hours) would have spent. Read through the MLflow
API: the parent run's tag sq.adaptive (the most repeats) and the runs' cost/gpu_hours."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analysis.runs import RunRecord
from pipeline.tracking import keys as K


def adaptive_line(parent: RunRecord | None, rows: Sequence[Any]) -> str | None:
    """One sentence, or None for a sweep that was not adaptive."""
    raw = parent.tag(K.TAG_ADAPTIVE) if parent is not None else ""
    if not raw.isdigit() or int(raw) < 1:
        return None
    repeats = int(raw)
    spent, full, runs, unknown = 0.0, 0.0, 0, []
    for row in rows:
        hours = [v for r in row.runs if r.finished and (v := r.metric(K.COST_GPU_HOURS)) is not None]
        if not hours:
            unknown.append(row.candidate)
            continue
        spent += sum(hours)
        runs += len(hours)
        full += sum(hours) / len(hours) * repeats
    if unknown or full <= 0:
        return (
            f"Adaptive qualification (at most {repeats} repeats a candidate): the full grid's GPU-hours are not "
            f"known ({len(unknown)} candidate(s) logged no {K.COST_GPU_HOURS})."
        )
    return (
        f"Adaptive qualification (sweep.adaptive, at most {repeats} repeats a candidate): {spent:,.3g} GPU-hours "
        f"over {runs} run(s); the full grid ({len(rows)} candidate(s) x {repeats} repeats, each run at its "
        f"candidate's mean) would have spent {full:,.3g} ({1 - spent / full:.0%} fewer)."
    )
