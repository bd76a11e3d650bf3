"""drill=preempt: a real preemption after a step of the first attempt (three Slurm triggers, or
a signal on the local executor); every rank saves at the step boundary, the job is requeued
and resumes from that checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from pipeline.config.checks import require as _require
from pipeline.contract.records import StopReason
from pipeline.drills.base import DrillSpec

PreemptTrigger = Literal["signal", "urgent", "requeue", "local"]
PREEMPT_TRIGGERS: tuple[str, ...] = get_args(PreemptTrigger)
SLURM_TRIGGERS = ("urgent", "requeue")  # the triggers only a Slurm cluster can pull


@dataclass
class PreemptDrillConfig:
    enabled: bool = False
    """Preempt the job at a step; it must save, requeue and resume."""
    trigger: str = "signal"
    """signal (scancel --signal=USR2 --full) | urgent (a job on the urgent partition preempts it)
    | requeue (scontrol requeue) | local (USR2 to the local executor's tasks)."""
    at_step: int = 10
    """Optimizer step after which the preemption is triggered (first attempt), in [1, train.steps)."""

    def __post_init__(self) -> None:
        _require(self.at_step >= 1, "drill.preempt.at_step", self.at_step, "an integer >= 1")
        _require(
            self.trigger in PREEMPT_TRIGGERS,
            "drill.preempt.trigger",
            self.trigger,
            " | ".join(PREEMPT_TRIGGERS),
        )


SPEC = DrillSpec(
    name="preempt",
    order=20,
    summary="preempt the job at a step (a Slurm trigger, or USR2 locally): save, requeue, resume",
    options=PreemptDrillConfig,
    doc="Preemption drill.",
    # USR2 from the scheduler's warning; SIGTERM from a requeue
    stops=(StopReason.PREEMPT, StopReason.TERMINATED),
    stopped_by="a preemption signal",
    needs_trigger=True,
    reference=True,
)
