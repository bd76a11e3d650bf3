"""drill=preempt: a real preemption after a step of the first attempt (three Slurm triggers, or
a signal on the local executor); every rank saves at the step boundary, the job is requeued
and resumes from that checkpoint."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args

from pipeline.config.checks import require as _require
from pipeline.contract.records import StopReason
from pipeline.drills.base import DrillSpec

if TYPE_CHECKING:
    from pipeline.config.schema import DrillConfig
    from pipeline.job.attempt import AttemptContext
    from pipeline.job.distributed import RankEnv
    from pipeline.sched import JobIdentity

log = logging.getLogger("pipeline.drill")  # the job log's `[drill] ...` lines

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


WAIT_FOR_SIGNAL_S = 120  # a preempt drill waits this long at its step for the signal to arrive


def trigger_preemption(trigger: str, job: JobIdentity | None) -> str:
    """Preempt this very job, for real; returns what was done (logged). `job`: this job's own
    identity (its scheduler's `this_job`), None for a point of a local sweep, which is
    signalled locally whatever SLURM_JOB_ID says (pipeline.sched: the Slurm triggers there, the
    local USR2 in sched/local.py)."""
    from pipeline.job.drills.base import SLURM_TIMEOUT_S
    from pipeline.sched import scheduler_of

    return scheduler_of(job).preempt_self(trigger, job, SLURM_TIMEOUT_S)


class PreemptDrill:
    """After `at_step` on the first attempt, rank 0 preempts the job; the stop flag, set by
    the signal that follows, makes every rank save at a step boundary. A trigger that fails is
    the drill's failure: the ranks agree on it in one collective and all raise DrillError."""

    def __init__(
        self,
        cfg: DrillConfig,
        renv: RankEnv,
        first_attempt: bool,
        job: JobIdentity | None,
        trigger: Callable[[str, JobIdentity | None], str] = trigger_preemption,
    ) -> None:
        self.at_step, self.trigger, self.renv, self.job = cfg.preempt.at_step, cfg.preempt.trigger, renv, job
        self.armed = first_attempt
        self.done = ""
        self._trigger = trigger

    def after_step(self, trainer: Any, step: int) -> None:
        if not (self.armed and step == self.at_step):
            return
        from pipeline.job.drills.base import DrillError
        from pipeline.sched import SchedulerTimeout

        self.armed = False
        error = ""
        if self.renv.is_main:
            try:
                self.done = self._trigger(self.trigger, self.job)
                log.info("preempt at step %d: %s", step, self.done)
            except SchedulerTimeout as e:  # the request may still take effect: wait for its signal
                self.done = f"{self.trigger} (Slurm answered late: {e})"
                log.warning("preempt at step %d: %s; waiting for the signal all the same", step, e)
            except Exception as e:  # the drill's own failure, not the candidate's
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                log.warning("preempt at step %d: the trigger failed: %s", step, error)
        if not trainer.comm.all_ok(not error):
            raise DrillError(
                f"preempt drill: its trigger '{self.trigger}' failed at step {step}"
                + (f": {error}" if error else " on rank 0")
            )
        # wait here for the signal (the scheduler takes a moment to deliver it), so that the
        # drill does not race a short run to its end; bounded, and every rank waits alike
        deadline = time.time() + WAIT_FOR_SIGNAL_S
        while not trainer.stop.is_set() and time.time() < deadline:
            time.sleep(0.05)

    @property
    def fired(self) -> bool:
        """Its trigger fired in this attempt (rank 0's word; the stop record carries it)."""
        return bool(self.done)


def hook(ctx: AttemptContext) -> PreemptDrill | None:
    if not ctx.cfg.drill.preempt.enabled:
        return None
    return PreemptDrill(ctx.cfg.drill, ctx.renv, ctx.first, ctx.slurm)


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
    hook=hook,
)
