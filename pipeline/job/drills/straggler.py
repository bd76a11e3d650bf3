"""drill=straggler: one rank is slowed inside every step; the straggler score must name it.
Its in-step hook belongs to the observer (pipeline.job.observe, pipeline.job.straggler), which
also scores every run for stragglers."""

from __future__ import annotations

from pipeline.job.drills.base import Drill

DRILL = Drill(
    name="straggler",
    summary="slow one rank inside every step; the straggler score must name it",
)
