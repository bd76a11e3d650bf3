"""One attempt of a run (one allocation) on one rank: what it knows when it starts
(`AttemptContext`, frozen), the one door its metrics and tags leave by (its `Recorder`,
pipeline.job.recorder), and the two ways it ends: with an outcome (`AttemptEnd`), or stopped
to be requeued (`AttemptStopped`). Each carries the attempt's record, which
`pipeline.job.entry` writes once, on rank 0."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.config.schema import Config
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptRecord, StopRecord
from pipeline.contract.spec import JobSpec, PointEnd
from pipeline.job.distributed import RankEnv
from pipeline.job.recorder import Recorder
from pipeline.sched import JobIdentity
from pipeline.train.progress import NullProgress


@dataclass(frozen=True)
class AttemptContext:
    """What an attempt knows when it starts. Built once by the job's entry, read by the runner."""

    spec: JobSpec
    cfg: Config
    renv: RankEnv
    point: PointDir
    process_start: float  # when this rank's process started (the attempt's clock starts here)
    stop: Any  # StopFlag: set by the signal handlers, read by the trainer at step boundaries
    recorder: Recorder  # the one door metrics, params, tags and artifacts leave by
    prior: tuple[AttemptRecord, ...] = ()  # records of the earlier attempts, oldest first
    prev_stop: StopRecord | None = None  # how the previous attempt stopped, if it did
    slurm: JobIdentity | None = None  # this job's own Slurm identity; None off Slurm (pipeline.sched)
    progress: Any = field(default_factory=NullProgress)  # rank 0's progress.json (pipeline.job.progress)

    @property
    def first(self) -> bool:
        return not self.prior

    def slurm_facts(self) -> dict[str, Any]:
        """What this allocation adds to its attempt record: Slurm's restart count, on Slurm."""
        return {"slurm_restarts": self.slurm.restart_count} if self.slurm is not None else {}

    def restarts(self, reason: str) -> int:
        """Earlier attempts that stopped for `reason` (a StopReason)."""
        return sum(1 for a in self.prior if a.stop == reason)


@dataclass(frozen=True)
class AttemptEnd:
    """The attempt ended the run: its outcome and its record."""

    outcome: PointEnd
    record: AttemptRecord


class AttemptStopped(Exception):
    """This attempt saved and must end; the entry decides from the record whether to requeue."""

    def __init__(self, stop: StopRecord, record: AttemptRecord) -> None:
        super().__init__(stop.reason)
        self.stop = stop
        self.record = record
