"""What every drill shares on the job's side: its entry in the registry (`Drill`), the hand-over
of a run to a drill (`HandOver`, `HandedOver`), its verdict, its failure, and what a stopped
attempt does next (the peer failure's stop record, the stop record, the requeue). No drill's
own code: that is its module of pipeline.drills."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE  # its controller restarts the tasks

from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptFacts, KillRecord, StopReason, StopRecord
from pipeline.drills.base import DrillSpec
from pipeline.sched import JobIdentity, scheduler_of

if TYPE_CHECKING:
    from pipeline.config.schema import DrillConfig
    from pipeline.contract.spec import PointEnd
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
    """One drill, as the job sees it: its module of pipeline.drills (`spec`, one module per
    drill, its runtime functions with it), with what a drill lacking one does by default."""

    spec: DrillSpec

    @property
    def hook(self) -> Callable[[AttemptContext], Any]:
        """The trainer's step hook for this attempt (`after_step(trainer, step)`), or None."""
        return self.spec.hook or _no_hook

    @property
    def before_stop(self) -> Callable[[KillRecord | None, int | None], list[str]]:
        """Evidence it lacks that no attempt record holds (what the killed rank wrote)."""
        return self.spec.before_stop or _no_evidence

    @property
    def at_stop(self) -> Callable[[AttemptFacts, float | None], list[str]] | None:
        """What the first stop must show; None: the signal, and a save at that step boundary."""
        return self.spec.at_stop

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

    def hands_over_at(self, cfg: DrillConfig, start_step: int) -> bool:
        """An attempt starting at `start_step` is already past this drill's hand-over (an
        earlier attempt got there): it hands over at once."""
        after = self.spec.hand_over_after
        return after is not None and start_step >= after(cfg)

    def hand_over(self, attempt: Any, trainer: Any) -> HandedOver:
        """The rest of the run, as this drill runs it after its step (reshape: resumed ranks)."""
        assert self.spec.hand_over is not None, f"drill {self.name} takes no run over"
        return HandedOver(self, self.spec.hand_over(attempt, trainer))


@dataclass(frozen=True)
class HandedOver:
    """A run a drill took over after a step (pipeline.drills.base.DrillSpec.hand_over), and what
    its hand-over returned; the verify stage asks the same drill."""

    drill: Drill
    result: Any

    def verify(self, attempt: Any, trainer: Any) -> Verified | PointEnd:
        check = self.drill.spec.verify_hand_over
        assert check is not None
        out: Verified | PointEnd = check(attempt, trainer, self.result)
        return out


class HandOver(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised on every rank by a drill's step hook once the run is to be handed over to the
    drill (pipeline.drills.base.DrillSpec.hand_over); names the drill."""

    def __init__(self, drill: str) -> None:
        super().__init__(drill)
        self.drill = drill


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
    """A collective failed because another rank is gone or did not answer in time (gloo, NCCL,
    the timeout): by the exception's type and origin (pipeline.job.faults), not its words."""
    from pipeline.job.faults import is_collective_failure

    return is_collective_failure(exc)


def peer_failure(attempt: Any, exc: BaseException) -> StopRecord:
    """Another rank died mid-step (the kill_worker drill, or a real node failure): the run
    goes on from the last checkpoint in the next attempt. No collective: a peer is gone."""
    from pipeline.train.checkpoint import step_of

    trainer = attempt.trainer
    assert trainer is not None
    log.warning("rank %d: a peer failed: %s: %s", attempt.renv.rank, type(exc).__name__, str(exc)[:300])
    kill = attempt.point.read_kill()
    tags = trainer.checkpoints.tags()
    return StopRecord(
        reason=StopReason.PEER_FAILURE,
        signal_time=float(kill["time"]) if kill else time.time(),
        exit_time=0.0,
        stop_step=trainer.result.end_step,
        saved_step=step_of(tags[0]) if tags else 0,
        trigger=f"rank {kill['rank']} killed" if kill else type(exc).__name__,
        attempt=len(attempt.prior),
        dead_rank=int(kill["rank"]) if kill else None,
        detected_time=time.time(),
    )


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
