"""drill=reshape: after a step, every rank saves and leaves the loop; the job's rank 0 converts
the checkpoint to DeepSpeed's universal format and resumes it on fewer ranks; every step's loss
is compared with the reference run. It does not stop the job, but it starts ranks again."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.checks import require as _require
from pipeline.drills.base import DrillSpec


@dataclass
class ReshapeDrillConfig:
    enabled: bool = False
    """Resume on another number of ranks through DeepSpeed's universal checkpoint."""
    at_step: int = 10
    """The run saves after this step and goes on with `world_size` ranks, in [1, train.steps)."""
    world_size: int = 1
    """Ranks of the resumed run, >= 1: fewer than the job's, a divisor of them, on its first node."""

    def __post_init__(self) -> None:
        _require(self.at_step >= 1, "drill.reshape.at_step", self.at_step, "an integer >= 1")
        _require(self.world_size >= 1, "drill.reshape.world_size", self.world_size, "an integer >= 1")


SPEC = DrillSpec(
    name="reshape",
    order=50,
    summary="resume on fewer ranks through DeepSpeed's universal checkpoint",
    options=ReshapeDrillConfig,
    doc="Reshape drill (resume on fewer ranks).",
    reference=True,
    resumes_ranks=True,
)
