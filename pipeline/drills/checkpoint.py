"""drill=checkpoint: after a step, save, restore into a fresh engine, compare the state hashes,
and go on training (the trainer's round trip)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config.checks import require as _require
from pipeline.drills.base import DrillSpec

if TYPE_CHECKING:
    from pipeline.job.attempt import AttemptContext


@dataclass
class CheckpointDrillConfig:
    enabled: bool = False
    """Save mid-run, restore into a fresh engine, compare state hashes, go on training."""
    at_step: int = 5
    """Optimizer step after which the round trip happens, in [1, train.steps)."""

    def __post_init__(self) -> None:
        _require(self.at_step >= 1, "drill.checkpoint.at_step", self.at_step, "an integer >= 1")


def hook(ctx: AttemptContext) -> Any:
    """The trainer's round trip after `at_step` (pipeline.train.trainer.CheckpointDrill)."""
    if not ctx.cfg.drill.checkpoint.enabled:
        return None
    from pipeline.train.trainer import CheckpointDrill  # torch: only inside the job's rank

    return CheckpointDrill(ctx.cfg.drill.checkpoint.at_step)


SPEC = DrillSpec(
    name="checkpoint",
    order=10,
    summary="a verified checkpoint round trip mid-run (save, restore, compare state hashes)",
    options=CheckpointDrillConfig,
    doc="Checkpoint round-trip drill.",
    hook=hook,
)
