"""The drills, one module each, and the one list of them (`DRILLS`) that the rest of the job
reads: the runner's step hooks (`build_hooks`), whether a reference run follows
(`needs_reference`), which drills interrupt the run and what evidence they must show
(pipeline.job.evidence). Adding a drill is one module here, its entry in `DRILLS`, its options
as a field of pipeline.config.schema.DrillConfig and its `conf/drill/<name>.yaml`
(tests/unit/test_drill_registry.py checks the four agree)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.contract.records import StopRecord
from pipeline.job.derived import RestartBreakdown, breakdown  # where they were before the registry
from pipeline.job.drills import checkpoint, kill_worker, preempt, reshape, straggler, timeout
from pipeline.job.drills.base import (
    SLURM_TIMEOUT_S,
    Drill,
    DrillError,
    DrillVerdict,
    is_peer_failure,
    read_stop_record,
    requeue_and_exit,
    write_stop_record,
)
from pipeline.job.drills.kill_worker import KillWorkerDrill
from pipeline.job.drills.preempt import WAIT_FOR_SIGNAL_S, PreemptDrill, trigger_preemption

if TYPE_CHECKING:
    from pipeline.config.schema import DrillConfig
    from pipeline.job.attempt import AttemptContext

DRILLS: tuple[Drill, ...] = (
    checkpoint.DRILL,
    preempt.DRILL,
    kill_worker.DRILL,
    timeout.DRILL,
    reshape.DRILL,
    straggler.DRILL,
)
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


__all__ = [
    "BY_NAME",
    "DRILLS",
    "SLURM_TIMEOUT_S",
    "WAIT_FOR_SIGNAL_S",
    "Drill",
    "DrillError",
    "DrillVerdict",
    "KillWorkerDrill",
    "RestartBreakdown",
    "PreemptDrill",
    "StopRecord",
    "breakdown",
    "build_hooks",
    "enabled",
    "interrupting",
    "is_peer_failure",
    "needs_reference",
    "read_stop_record",
    "requeue_and_exit",
    "trigger_preemption",
    "write_stop_record",
]
