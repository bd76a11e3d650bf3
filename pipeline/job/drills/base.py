"""What every drill shares: its entry in the registry (`Drill`), its verdict, its failure, and
what a stopped attempt does next (the stop record, the requeue)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE  # its controller restarts the tasks

from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptFacts, KillRecord, StopReason, StopRecord
from pipeline.drills.base import DrillSpec
from pipeline.sched import JobIdentity, scheduler_of

if TYPE_CHECKING:
    from pipeline.job.attempt import AttemptContext

log = logging.getLogger("pipeline.drill")  # the job log's `[drill] ...` lines

# A drill's own Slurm calls (the trigger, the requeue) wait long: measured here under a load
# average of 26 on 2 cores, scancel took over 30 s to answer and its signal still arrived
SLURM_TIMEOUT_S = 120


def _no_hook(ctx: AttemptContext) -> Any:
    return None


def _no_evidence(*args: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class Drill:
    """One drill, as the job sees it: its declaration (pipeline.drills, one module per drill)
    and its runtime part, from its module in this package when it has one (`DRILL`); a drill
    with neither hook nor checks of its own has no module here."""

    spec: DrillSpec
    hook: Callable[[AttemptContext], Any] = _no_hook
    """The trainer's step hook for this attempt (`after_step(trainer, step)`), or None."""
    before_stop: Callable[[KillRecord | None, int | None], list[str]] = _no_evidence
    """Evidence it lacks that no attempt record holds (what the killed rank wrote)."""
    at_stop: Callable[[AttemptFacts, float | None], list[str]] | None = None
    """What the first stop must show; None: the signal, and a save at that step boundary."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def summary(self) -> str:
        return self.spec.summary

    @property
    def stops(self) -> tuple[StopReason, ...]:
        return self.spec.stops

    @property
    def stopped_by(self) -> str:
        return self.spec.stopped_by

    @property
    def needs_trigger(self) -> bool:
        return self.spec.needs_trigger

    @property
    def reference(self) -> bool:
        return self.spec.reference

    @property
    def interrupting(self) -> bool:
        return self.spec.interrupting


@dataclass
class DrillVerdict:
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Verified:
    """What the verify stage found: the final checkpoint restored, and the drills' verdict."""

    final_verified: bool
    drills: DrillVerdict


class RunStopped(Exception):  # noqa: N818 - control flow: the run (or its reference) stopped and saved
    def __init__(self, record: StopRecord) -> None:
        super().__init__(record.reason)
        self.record = record


class DrillError(Exception):
    """A drill could not do its part (its trigger failed): the point's drill failed, with this
    message; never a crash of the candidate, and no recovery labor (docs/design.md, "Cost")."""


def is_peer_failure(exc: BaseException) -> bool:
    """A collective failed because another rank is gone (gloo, NCCL, or the timeout)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    needles = (
        "connection closed by peer",
        "connection reset",
        "broken pipe",
        "nccl",
        "timed out",
        "timeout",
        "gloo",
    )
    return type(exc).__name__ in ("DistBackendError", "DistNetworkError") or any(n in text for n in needles)


def read_stop_record(point: PointDir) -> StopRecord | None:
    data = point.read_stop()
    return StopRecord(**data) if data else None


def write_stop_record(point: PointDir, record: StopRecord) -> None:
    point.write_stop(asdict(record))


def requeue_and_exit(job: JobIdentity | None) -> None:
    """Requeue this job and leave without a result, so submitit (or Slurm) runs it again.

    On Slurm, `scontrol requeue` of this job's own id (submitit's own way); on the local
    executor, the exit code its controller reads as 'start the tasks again'. Ranks other than
    the caller just exit."""
    sys.stdout.flush()
    if job is not None:
        scheduler_of(job).requeue_self(job, SLURM_TIMEOUT_S)  # an error is logged: often requeued already
        os._exit(1)
    if os.environ.get("SUBMITIT_LOCAL_JOB_ID"):
        os._exit(LOCAL_REQUEUE_RETURN_CODE)
    os._exit(3)  # started by hand: the caller starts it again
