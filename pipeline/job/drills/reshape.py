"""drill=reshape: after a step, every rank saves and leaves the loop; the job's rank 0 converts
the checkpoint to DeepSpeed's universal format and resumes it on fewer ranks
(pipeline.job.reshape runs it); every step's loss is compared with the reference run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.drills.reshape import SPEC
from pipeline.job.drills.base import Drill

if TYPE_CHECKING:
    from pipeline.job.attempt import AttemptContext


def _hook(ctx: AttemptContext) -> Any:
    if not ctx.cfg.drill.reshape.enabled:
        return None
    from pipeline.job.reshape import ReshapeDrill

    return ReshapeDrill(ctx.cfg.drill.reshape.at_step)


DRILL = Drill(
    SPEC,
    hook=_hook,
)
