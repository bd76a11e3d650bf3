"""The local scheduler: submitit's local executor runs each point on this machine, one after
another, inside the sweep's own process. No queue holds its jobs, so it has no states to
report, nothing to cancel but that process (pipeline.submit.control), no accounting and no
array limit; a job preempts itself by signalling its own tasks."""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from pipeline.sched.base import (
    Allocation,
    ClusterIdentity,
    JobIdentity,
    JobState,
    LauncherKind,
    OneTaskJob,
    SchedulerError,
    StartEstimate,
)

LOCAL_CLUSTER_PREFIX = "local-"
"""The local launcher's cluster is this machine: local-<hostname>."""
NO_SLURM = "none"
"""The Slurm version the local launcher records."""
LOCAL_TRIGGER = LauncherKind.LOCAL
"""The preempt trigger named after this launcher (config's PreemptTrigger "local")."""


@dataclass(frozen=True)
class LocalScheduler:
    kind: LauncherKind = LauncherKind.LOCAL
    keeps_jobs: bool = False
    runs_setup: bool = False  # the points run in this shell's environment as it is

    def job_states(self, job_ids: Iterable[str], job_name: str | None = None) -> dict[str, JobState] | None:
        """None of them: the local jobs are the sweep's own processes, which no scheduler holds."""
        return {}

    def cancel(self, job_ids: Iterable[str], best_effort: bool = False) -> None:
        """Nothing is queued: a local sweep is stopped by interrupting its own process."""

    def start_estimate(
        self, partition: str, nodes: int, gpus_per_node: int, time_limit_min: int
    ) -> StartEstimate:
        """No queue to ask: a local job starts when the sweep reaches it."""
        return StartEstimate(datetime.now().astimezone(), refused="the local launcher has no queue to ask")

    def allocations(self, job_id: str, job_name: str | None = None) -> list[Allocation] | None:
        """No accounting: a local point's bill is its attempts' own clocks."""
        return None

    def submit_job(self, job: OneTaskJob) -> str:
        """No queue to hold it: the local sweep's own process runs its adaptive rounds."""
        raise SchedulerError("the local launcher has no queue: it runs no job after the sweep returned")

    def release(self, job_ids: Iterable[str]) -> None:
        """Nothing is held."""

    def jobs_named(self, name: str) -> dict[str, JobState] | None:
        return {}

    def max_array_size(self) -> int:
        return sys.maxsize  # the points run one after another, never as an array

    def identity(self) -> ClusterIdentity:
        """This machine: no controller and no Slurm, named after its host."""
        host = socket.gethostname()
        return ClusterIdentity(f"{LOCAL_CLUSTER_PREFIX}{host}", host, NO_SLURM)

    def this_job(self, env: Mapping[str, str] | None = None) -> JobIdentity | None:
        """None, even where SLURM_JOB_ID is set (an salloc shell, an sbatch script: the user's
        job, not one this tool submitted): it must never be signalled, requeued or billed."""
        return None

    def requeue_self(self, job: JobIdentity | None, timeout_s: float) -> None:
        """Nothing to ask: the exit code the local controller reads as 'start again' does it."""

    def preempt_self(self, trigger: str, job: JobIdentity | None, timeout_s: float) -> str:
        """USR2 to every task of this point: the local executor's tasks are the children of its
        controller, signalled all the way submitit's controller forwards a timeout warning."""
        import psutil

        from pipeline.sched.warm import CLIENT_ENV

        # a warm rank's parent is the warm server; its client is the controller's task
        me = int(os.environ.get(CLIENT_ENV) or os.getpid())
        parent = psutil.Process(me).parent() or psutil.Process(os.getppid())
        tasks = [p for p in parent.children() if p.pid != parent.pid]
        for p in tasks:
            p.send_signal(signal.SIGUSR2)
        instead = (
            f" (trigger '{trigger}' needs a Slurm job of this sweep: sent locally)"
            if trigger != LOCAL_TRIGGER
            else ""
        )
        return f"SIGUSR2 to the {len(tasks)} local task(s){instead}"
