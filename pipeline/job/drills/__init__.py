"""The drills as the job runs them, and the one list of them (`DRILLS`) that the rest of the job
reads: the runner's step hooks (`build_hooks`), the run a drill takes over (`handing_over`,
`HandOver`), whether a reference run follows (`needs_reference`), which drills interrupt the
run and what evidence they must show (pipeline.job.evidence). Each drill is its module of
pipeline.drills (its options, its stops, and its runtime functions, which import the job's code
inside them); this package names none of them: it holds what the drills share on the job's
side (`base`: the entry, the hand-over, the stop records, the requeue; `reference`: the
evidence check and the uninterrupted reference run)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.contract.records import StopRecord
from pipeline.drills import SPECS
from pipeline.drills.base import DrillSpec
from pipeline.job.derived import RestartBreakdown, breakdown  # where they were before the registry
from pipeline.job.drills.base import (
    SLURM_TIMEOUT_S,
    Drill,
    DrillError,
    DrillVerdict,
    HandedOver,
    HandOver,
    Verified,
    is_peer_failure,
    peer_failure,
    read_stop_record,
    requeue_and_exit,
    write_stop_record,
)

if TYPE_CHECKING:
    from pipeline.config.schema import DrillConfig
    from pipeline.job.attempt import AttemptContext


def registry(specs: tuple[DrillSpec, ...] = SPECS) -> tuple[Drill, ...]:
    """Every declared drill, as the job runs it (its module's runtime functions with it)."""
    return tuple(Drill(spec) for spec in specs)


DRILLS: tuple[Drill, ...] = registry()
"""Every drill, in the order they are named in configs and docs."""

BY_NAME = {d.name: d for d in DRILLS}


def enabled(cfg: DrillConfig) -> list[Drill]:
    """The drills this point runs (drill=[checkpoint,preempt] runs both)."""
    return [d for d in DRILLS if getattr(cfg, d.name).enabled]


def interrupting(cfg: DrillConfig) -> list[str]:
    """The enabled drills that stop the job and need a resume."""
    return [d.name for d in enabled(cfg) if d.interrupting]


def needs_reference(cfg: DrillConfig) -> bool:
    """An enabled drill is checked against an uninterrupted reference run (and one is on)."""
    return cfg.reference and any(d.reference for d in enabled(cfg))


def build_hooks(ctx: AttemptContext) -> list[Any]:
    """The step hooks of this attempt's enabled drills, in registry order."""
    hooks = [d.hook(ctx) for d in enabled(ctx.cfg.drill)]
    return [h for h in hooks if h is not None]


def handing_over(cfg: DrillConfig, start_step: int) -> Drill | None:
    """The enabled drill an attempt starting at `start_step` hands the run over to at once (an
    earlier attempt reached its step), or None."""
    return next((d for d in enabled(cfg) if d.hands_over_at(cfg, start_step)), None)


__all__ = [
    "BY_NAME",
    "DRILLS",
    "SLURM_TIMEOUT_S",
    "Drill",
    "DrillError",
    "DrillVerdict",
    "HandOver",
    "HandedOver",
    "RestartBreakdown",
    "StopRecord",
    "Verified",
    "breakdown",
    "build_hooks",
    "enabled",
    "handing_over",
    "interrupting",
    "is_peer_failure",
    "needs_reference",
    "peer_failure",
    "read_stop_record",
    "requeue_and_exit",
    "write_stop_record",
]
