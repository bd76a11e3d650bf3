"""The scheduler interface: what the login node and the job ask of whatever runs the points.

`LauncherKind` names the two schedulers a sweep can run on ("auto" is a config-level choice,
resolved once by `pipeline.sched.choose`); `Scheduler` is the one protocol both implement
(`pipeline.sched.local`, `pipeline.sched.slurm`). Callers hold a `Scheduler` (from
`scheduler_for(manifest.launcher)`) and call its methods or read its capabilities: nothing
outside this package compares launcher strings (tests/unit/test_sched.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from pipeline.slurm.cluster import Allocation, ClusterIdentity, JobState, StartEstimate
from pipeline.slurm.commands import SlurmCommandError, SlurmTimeout
from pipeline.slurm.job import SlurmJob


class LauncherKind(StrEnum):
    """Where a sweep's points run; the value is what the manifest and the spec record."""

    LOCAL = "local"  # the embedded default: submitit's local executor, on this machine
    SLURM = "slurm"  # one submitit job array per resource shape


SchedulerError = SlurmCommandError
"""A scheduler refused a request or did not answer (Slurm's client errors are the only ones)."""
SchedulerTimeout = SlurmTimeout
"""A request that was not answered in time and may still take effect."""
JobIdentity = SlurmJob
"""This job's own identity as its scheduler knows it (only a Slurm job has one today)."""


@dataclass(frozen=True)
class OneTaskJob:
    """A small job of one task (the adaptive controller): what `Scheduler.submit_job` queues."""

    name: str
    partition: str
    time_min: int
    command: str
    """One shell line, run from `workdir`."""
    workdir: str
    output: str
    """Its stdout and stderr; `%j` is the job id."""
    after: tuple[str, ...] = ()
    """Start only once each of these jobs ended, whatever its state (afterany)."""
    hold: bool = False
    """Queued held: it starts only after `release`."""


class Scheduler(Protocol):
    """What the rest of the code asks of a scheduler. A second Slurm cluster is a second
    `SlurmScheduler` instance (its own SLURM_CONF / cluster name, handed to every client call
    as `-M <name>` / SLURM_CONF), not a new kind. Job ids passed to the job methods may be
    `<cluster>:<id>` references (pipeline.slurm.job.job_ref): each is asked of its own cluster."""

    @property
    def kind(self) -> LauncherKind:
        """What the manifest and the spec record for it."""
        ...

    @property
    def keeps_jobs(self) -> bool:
        """True when the scheduler queues the sweep's jobs and runs them after the submitting
        process returned (Slurm): their states, cancels, requeues and final bills are asked of
        it, and its cluster's limits are checked before submitting. False when the sweep's own
        process runs its points one after another (local): their processes are the truth, and
        nothing bills them."""
        ...

    @property
    def runs_setup(self) -> bool:
        """The partition's `setup` lines run before a job's tasks (the batch script's top lines)."""
        ...

    def job_states(self, job_ids: Iterable[str], job_name: str | None = None) -> dict[str, JobState] | None:
        """The state of each job the scheduler knows; None when it does not answer."""
        ...

    def cancel(self, job_ids: Iterable[str], best_effort: bool = False) -> None:
        """Cancel these jobs; raises SchedulerError, or (best_effort) ignores every error."""
        ...

    def allocations(self, job_id: str, job_name: str | None = None) -> list[Allocation] | None:
        """Every allocation the scheduler's accounting bills for a job; None without a record."""
        ...

    def submit_job(self, job: OneTaskJob) -> str:
        """Queue a one-task job that runs `job.command` (a shell line); its id. Raises
        SchedulerError (nothing queued, or, on SchedulerTimeout, maybe queued)."""
        ...

    def release(self, job_ids: Iterable[str]) -> None:
        """Let held jobs start; jobs no longer held (or gone) are left as they are. Raises
        SchedulerError when the scheduler does not answer."""
        ...

    def jobs_named(self, name: str) -> dict[str, JobState] | None:
        """Every job the queue holds under this job name; None when it does not answer."""
        ...

    def max_array_size(self) -> int:
        """The most points one submission (a job array) may hold."""
        ...

    def identity(self) -> ClusterIdentity:
        """The cluster the points run on (name, controller host, Slurm version), read once when a
        sweep is planned and recorded on every run. Raises ConfigError when it cannot be read."""
        ...

    def start_estimate(
        self, partition: str, nodes: int, gpus_per_node: int, time_limit_min: int
    ) -> StartEstimate:
        """When a job of this shape would start on `partition`, as the scheduler answers now
        (nothing is submitted); the answer keeps its date, or says why there is none."""
        ...

    def this_job(self, env: Mapping[str, str] | None = None) -> JobIdentity | None:
        """This process's own job, when it runs a point this tool submitted to this scheduler."""
        ...

    def requeue_self(self, job: JobIdentity | None, timeout_s: float) -> None:
        """Ask the scheduler to run this job again (the caller then exits); never raises."""
        ...

    def preempt_self(self, trigger: str, job: JobIdentity | None, timeout_s: float) -> str:
        """Preempt this very job, for real, the way `trigger` says; what was done (logged).
        Raises SchedulerError (or SchedulerTimeout: it may still take effect)."""
        ...
