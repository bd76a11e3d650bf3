"""The Slurm scheduler: submitit job arrays, and every question about them answered by the
Slurm clients through pipeline.slurm (commands.py runs them, cluster.py parses their answers;
no other code runs a Slurm client).

A second Slurm cluster is a second `SlurmScheduler` with its own `slurm_conf` (SLURM_CONF of
its clients) or `cluster` (their --clusters). Both are recorded here and not yet handed to the
clients: every instance today addresses the cluster of this machine's default slurm.conf.
"""

from __future__ import annotations

import getpass
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from pipeline.sched.base import (
    Allocation,
    JobIdentity,
    JobState,
    LauncherKind,
    OneTaskJob,
    SchedulerError,
    SchedulerTimeout,
)
from pipeline.sched.local import LOCAL_TRIGGER, LocalScheduler
from pipeline.slurm import cluster as slurm_cluster
from pipeline.slurm import commands
from pipeline.slurm import job as slurm_job

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlurmScheduler:
    slurm_conf: str | None = None
    """The SLURM_CONF its clients read; None: this machine's default."""
    cluster: str | None = None
    """The --clusters name its clients address; None: the default cluster."""
    kind: LauncherKind = LauncherKind.SLURM
    keeps_jobs: bool = True
    runs_setup: bool = True  # the partition's setup lines are the batch script's top lines

    def job_states(self, job_ids: Iterable[str], job_name: str | None = None) -> dict[str, JobState] | None:
        """squeue's live truth over sacct's records (pipeline.slurm.cluster.read_job_states)."""
        return slurm_cluster.read_job_states(job_ids, job_name)

    def cancel(self, job_ids: Iterable[str], best_effort: bool = False) -> None:
        """One scancel per job array (its tasks), one for the plain jobs; raises
        SchedulerError. best_effort: one bounded scancel for all, errors ignored (a submission
        rolled back)."""
        if best_effort:
            commands.cancel(job_ids)
            return
        arrays: dict[str, list[str]] = {}
        for j in job_ids:
            arrays.setdefault(j.split("_", 1)[0] if "_" in j else "", []).append(j)
        for tasks in arrays.values():
            commands.run(["scancel", *sorted(tasks)])

    def allocations(self, job_id: str, job_name: str | None = None) -> list[Allocation] | None:
        return slurm_cluster.read_allocations(job_id, job_name)

    def max_array_size(self) -> int:
        return slurm_cluster.max_array_size()

    def submit_job(self, job: OneTaskJob) -> str:
        """`sbatch --parsable --wrap`: one task on one node, afterany on the array ids of `after`."""
        options = [
            f"--job-name={job.name}",
            f"--partition={job.partition}",
            "--nodes=1",
            "--ntasks=1",
            f"--time={job.time_min}",
            f"--chdir={job.workdir}",
            f"--output={job.output}",
        ]
        bases = sorted({j.split("_", 1)[0] for j in job.after if j})
        if bases:
            options.append("--dependency=afterany:" + ":".join(bases))
        if job.hold:
            options.append("--hold")
        return commands.submit_wrap(options, job.command).split(";", 1)[0]

    def release(self, job_ids: Iterable[str]) -> None:
        """`scontrol release`, one call; a refusal (not held, gone) is logged, a silence raises."""
        try:
            commands.release(job_ids)
        except SchedulerTimeout:
            raise
        except SchedulerError as e:
            log.info("%s", e)

    def jobs_named(self, name: str) -> dict[str, JobState] | None:
        return slurm_cluster.jobs_named(name)

    def start_estimate(
        self, partition: str, nodes: int, gpus_per_node: int, time_limit_min: int
    ) -> slurm_cluster.StartEstimate:
        """`sbatch --test-only` of the shape: whole nodes with their GPUs, for the time limit."""
        asked = datetime.now().astimezone()
        gres = [f"--gres=gpu:{gpus_per_node}"] if gpus_per_node else []
        options = ["-p", partition, "-N", str(nodes), "--exclusive", *gres, "-t", str(time_limit_min)]
        return slurm_cluster.parse_test_only(commands.test_only(options), asked)

    def identity(self) -> slurm_cluster.ClusterIdentity:
        """ClusterName, SlurmctldHost[0] and SLURM_VERSION of `scontrol show config`."""
        return slurm_cluster.read_identity()

    def max_job_count(self) -> int:
        return slurm_cluster.max_job_count()

    def settings(self) -> dict[str, str] | None:
        """`scontrol show config` as name -> value; None when the controller does not answer."""
        return slurm_cluster.show_config()

    def submit_limit(
        self, account: str | None, qos: str | None, settings: dict[str, str] | None = None
    ) -> slurm_cluster.SubmitLimit | None:
        """The MaxSubmitJobs limit that binds this user's jobs on `account` and `qos` (sacctmgr),
        with the jobs queued there already; None where none is set or enforced. `settings`:
        the controller's configuration as read already (settings())."""
        return slurm_cluster.submit_limit(getpass.getuser(), account, qos, settings)

    def read_cluster(self) -> slurm_cluster.ClusterInfo:
        """Partitions and nodes as scontrol reports them; raises SchedulerError."""
        return slurm_cluster.read_cluster()

    def hostnames(self, nodelist: str, timeout_s: float = commands.CLIENT_TIMEOUT_S) -> list[str]:
        return commands.hostnames(nodelist, timeout_s)

    def node_line(self, node: str, timeout_s: float = commands.CLIENT_TIMEOUT_S) -> str | None:
        """`scontrol show node` of one node, or None when Slurm does not answer."""
        return commands.show_node(node, timeout_s)

    def answers(self) -> bool:
        """A controller answers `sinfo` on this machine."""
        return commands.answers()

    def this_job(self, env: Mapping[str, str] | None = None) -> JobIdentity | None:
        """The Slurm job this process is (its own task id, pipeline.slurm.job); None outside one."""
        return slurm_job.this_job(env)

    def requeue_self(self, job: JobIdentity | None, timeout_s: float) -> None:
        """`scontrol requeue` of this job's own id (submitit's own way); an error is logged
        (Slurm is often requeueing it already)."""
        if job is None:
            return
        try:
            commands.requeue(job.job_id, timeout_s)
        except SchedulerError as e:
            log.info("%s", e)

    def preempt_self(self, trigger: str, job: JobIdentity | None, timeout_s: float) -> str:
        """The three Slurm triggers; the local one (or no job of this sweep) signals locally."""
        if trigger == LOCAL_TRIGGER or job is None:
            return LocalScheduler().preempt_self(trigger, job, timeout_s)
        if trigger == "signal":
            # what a scheduler's warning sends; --full so the batch shell gets it too (it traps it)
            commands.signal_job(job.job_id, "USR2", timeout_s)
            return f"scancel --signal=USR2 --full {job.job_id}"
        if trigger == "requeue":
            commands.requeue(job.job_id, timeout_s)
            return f"scontrol requeue {job.job_id}"
        if trigger == "urgent":
            return self._urgent(job, timeout_s)
        raise ValueError(f"unknown preempt trigger {trigger!r}")

    def _urgent(self, job: JobIdentity, timeout_s: float) -> str:
        """A one-minute exclusive job in the `urgent` partition on this job's first node: the
        partition's priority preempts this job."""
        nodes = commands.hostnames(job.nodelist, timeout_s)
        if not nodes:
            raise SchedulerError(f"Slurm did not expand the job's node list {job.nodelist!r}")
        options: Sequence[str] = [
            "--partition=urgent",
            f"--nodelist={nodes[0]}",
            "--exclusive",
            "--time=1",
            f"--job-name=sq-urgent-{job.job_id}",
            "--output=/dev/null",
        ]
        out = commands.submit_wrap(list(options), "sleep 3", timeout_s)
        return f"urgent job {out} on {nodes[0]} (partition priority preempts {job.job_id})"
