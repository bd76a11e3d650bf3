"""drill=checkpoint: after a step, save, restore into a fresh engine, compare the state hashes,
and go on training (the trainer's round trip)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.drills.checkpoint import SPEC
from pipeline.job.drills.base import Drill

if TYPE_CHECKING:
    from pipeline.job.attempt import AttemptContext


def _hook(ctx: AttemptContext) -> Any:
    if not ctx.cfg.drill.checkpoint.enabled:
        return None
    from pipeline.train.trainer import CheckpointDrill  # torch: only inside the job's rank

    return CheckpointDrill(ctx.cfg.drill.checkpoint.at_step)


DRILL = Drill(
    SPEC,
    hook=_hook,
)
