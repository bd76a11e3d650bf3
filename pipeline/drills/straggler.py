"""drill=straggler: one rank is slowed inside every step; the straggler score must name it."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.checks import require as _require
from pipeline.drills.base import DrillSpec


@dataclass
class StragglerDrillConfig:
    enabled: bool = False
    """Slow one rank down inside every step; the straggler score must name it."""
    rank: int = 1
    """The rank that is slowed (0 .. world size - 1)."""
    fraction: float = 0.3
    """How much slower, as a fraction of the rank's own forward time (0.3: 30% slower)."""

    def __post_init__(self) -> None:
        _require(self.rank >= 0, "drill.straggler.rank", self.rank, "an integer >= 0")
        _require(0 < self.fraction <= 10, "drill.straggler.fraction", self.fraction, "0 < fraction <= 10")


SPEC = DrillSpec(
    name="straggler",
    order=60,
    summary="slow one rank inside every step; the straggler score must name it",
    options=StragglerDrillConfig,
    doc="Slow one rank (pipeline/job/straggler.py).",
)
