"""The Slurm scheduler: submitit job arrays, and every question about them answered by the
Slurm clients through pipeline.slurm (commands.py runs them, cluster.py parses their answers;
no other code runs a Slurm client).

A second Slurm cluster is a second `SlurmScheduler` with its own `cluster` (handed to every
client as `-M <name>`: a cluster that shares this login node's slurmdbd, docs/clusters.md
section 10) or `slurm_conf` (the SLURM_CONF its clients read). Both go into every client call
through `pipeline.slurm.commands.Address`; the default instance addresses the cluster of this
machine's slurm.conf. Job ids are each cluster's own: a job of another cluster is recorded as
`<cluster>:<id>` (`pipeline.slurm.job.job_ref`), and the job methods below address each such
reference's own cluster, whichever instance is asked.
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
from pipeline.slurm.container import ContainerLaunch as ContainerLaunch  # the launcher's, through here
from pipeline.slurm.container import ContainerSpec as ContainerSpec
from pipeline.slurm.container import image_digest as image_digest
from pipeline.slurm.container import launch as launch
from pipeline.slurm.container import request_requeue

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

    @property
    def at(self) -> commands.Address:
        """Where this instance's client calls go."""
        return commands.Address(self.cluster, self.slurm_conf)

    def on(self, cluster: str | None) -> SlurmScheduler:
        """The scheduler of `cluster` (a name `-M` reaches from here); this one for None."""
        return self if not cluster or cluster == self.cluster else SlurmScheduler(self.slurm_conf, cluster)

    def _by_cluster(self, refs: Iterable[str]) -> dict[str | None, dict[str, str]]:
        """The references grouped by the cluster each addresses: {cluster: {job id: reference}}."""
        groups: dict[str | None, dict[str, str]] = {}
        for ref in refs:
            if ref:
                cluster, job_id = slurm_job.split_ref(ref)
                groups.setdefault(cluster, {})[job_id] = ref
        return groups

    def job_states(self, job_ids: Iterable[str], job_name: str | None = None) -> dict[str, JobState] | None:
        """squeue's live truth over sacct's records (pipeline.slurm.cluster.read_job_states),
        asked of each reference's own cluster; keyed by the references asked. None when no
        cluster answered."""
        groups = self._by_cluster(job_ids)
        if not groups:
            return {}
        out: dict[str, JobState] = {}
        answered = False
        for cluster, refs in groups.items():
            states = slurm_cluster.read_job_states(refs, job_name, at=self.on(cluster).at)
            if states is not None:
                answered = True
                out.update({refs[j]: s for j, s in states.items() if j in refs})
        return out if answered else None

    def cancel(self, job_ids: Iterable[str], best_effort: bool = False) -> None:
        """One scancel per job array (its tasks), one for the plain jobs, each on its own
        cluster; raises SchedulerError. best_effort: one bounded scancel per cluster, errors
        ignored (a submission rolled back)."""
        for cluster, refs in self._by_cluster(job_ids).items():
            at = self.on(cluster).at
            if best_effort:
                commands.cancel(refs, at=at)
                continue
            arrays: dict[str, list[str]] = {}
            for j in refs:
                arrays.setdefault(j.split("_", 1)[0] if "_" in j else "", []).append(j)
            for tasks in arrays.values():
                commands.run(["scancel", *sorted(tasks)], at=at)

    def allocations(self, job_id: str, job_name: str | None = None) -> list[Allocation] | None:
        cluster, bare = slurm_job.split_ref(job_id)
        return slurm_cluster.read_allocations(bare, job_name, at=self.on(cluster).at)

    def max_array_size(self) -> int:
        return slurm_cluster.max_array_size(at=self.at)

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
        return commands.submit_wrap(options, job.command, at=self.at).split(";", 1)[0]

    def release(self, job_ids: Iterable[str]) -> None:
        """`scontrol release`, one call; a refusal (not held, gone) is logged, a silence raises."""
        try:
            commands.release(job_ids, at=self.at)
        except SchedulerTimeout:
            raise
        except SchedulerError as e:
            log.info("%s", e)

    def jobs_named(self, name: str) -> dict[str, JobState] | None:
        return slurm_cluster.jobs_named(name, at=self.at)

    def start_estimate(
        self, partition: str, nodes: int, gpus_per_node: int, time_limit_min: int
    ) -> slurm_cluster.StartEstimate:
        """`sbatch --test-only` of the shape: whole nodes with their GPUs, for the time limit."""
        asked = datetime.now().astimezone()
        gres = [f"--gres=gpu:{gpus_per_node}"] if gpus_per_node else []
        options = ["-p", partition, "-N", str(nodes), "--exclusive", *gres, "-t", str(time_limit_min)]
        return slurm_cluster.parse_test_only(commands.test_only(options, at=self.at), asked)

    def identity(self) -> slurm_cluster.ClusterIdentity:
        """ClusterName, SlurmctldHost[0] and SLURM_VERSION of `scontrol show config`."""
        return slurm_cluster.read_identity(at=self.at)

    def max_job_count(self) -> int:
        return slurm_cluster.max_job_count(at=self.at)

    def settings(self) -> dict[str, str] | None:
        """`scontrol show config` as name -> value; None when the controller does not answer."""
        return slurm_cluster.show_config(at=self.at)

    def submit_limit(
        self, account: str | None, qos: str | None, settings: dict[str, str] | None = None
    ) -> slurm_cluster.SubmitLimit | None:
        """The MaxSubmitJobs limit that binds this user's jobs on `account` and `qos` (sacctmgr),
        with the jobs queued there already; None where none is set or enforced. `settings`:
        the controller's configuration as read already (settings())."""
        return slurm_cluster.submit_limit(getpass.getuser(), account, qos, settings, at=self.at)

    def read_cluster(self) -> slurm_cluster.ClusterInfo:
        """Partitions and nodes as scontrol reports them; raises SchedulerError."""
        return slurm_cluster.read_cluster(at=self.at)

    def hostnames(self, nodelist: str, timeout_s: float = commands.CLIENT_TIMEOUT_S) -> list[str]:
        return commands.hostnames(nodelist, timeout_s, self.at)

    def node_line(self, node: str, timeout_s: float = commands.CLIENT_TIMEOUT_S) -> str | None:
        """`scontrol show node` of one node, or None when Slurm does not answer."""
        return commands.show_node(node, timeout_s, self.at)

    def known_clusters(self) -> list[str] | None:
        """Every cluster this machine's slurmdbd knows (`sacctmgr show cluster`): the names
        `-M` may address; None when the accounting database does not answer."""
        return commands.clusters()

    def answers(self) -> bool:
        """A controller answers `sinfo` on this machine."""
        return commands.answers(at=self.at)

    def this_job(self, env: Mapping[str, str] | None = None) -> JobIdentity | None:
        """The Slurm job this process is (its own task id, pipeline.slurm.job); None outside one."""
        return slurm_job.this_job(env)

    def requeue_self(self, job: JobIdentity | None, timeout_s: float) -> None:
        """`scontrol requeue` of this job's own id (submitit's own way); an error is logged
        (Slurm is often requeueing it already). Inside an image, the batch shell on the host
        requeues it as it exits (pipeline.slurm.container): the request is left for it."""
        if job is None:
            return
        if request_requeue():
            log.info("requeue of %s asked of the batch shell (outside the image)", job.job_id)
            return
        try:
            commands.requeue(job.job_id, timeout_s, self.at)
        except SchedulerError as e:
            log.info("%s", e)

    def preempt_self(self, trigger: str, job: JobIdentity | None, timeout_s: float) -> str:
        """The three Slurm triggers; the local one (or no job of this sweep) signals locally."""
        if trigger == LOCAL_TRIGGER or job is None:
            return LocalScheduler().preempt_self(trigger, job, timeout_s)
        if trigger == "signal":
            # what a scheduler's warning sends; --full so the batch shell gets it too (it traps it)
            commands.signal_job(job.job_id, "USR2", timeout_s, self.at)
            return f"scancel --signal=USR2 --full {job.job_id}"
        if trigger == "requeue":
            commands.requeue(job.job_id, timeout_s, self.at)
            return f"scontrol requeue {job.job_id}"
        if trigger == "urgent":
            return self._urgent(job, timeout_s)
        raise ValueError(f"unknown preempt trigger {trigger!r}")

    def _urgent(self, job: JobIdentity, timeout_s: float) -> str:
        """A one-minute exclusive job in the `urgent` partition on this job's first node: the
        partition's priority preempts this job."""
        nodes = commands.hostnames(job.nodelist, timeout_s, self.at)
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
        out = commands.submit_wrap(list(options), "sleep 3", timeout_s, self.at)
        return f"urgent job {out} on {nodes[0]} (partition priority preempts {job.job_id})"
