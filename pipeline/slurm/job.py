"""This job's own Slurm identity: the one owner of the id that every drill trigger, requeue,
`scontrol` and `sacct` call of a job addresses. Torch-free.

Two facts make reading `SLURM_JOB_ID` directly wrong (docs/design.md, "Drills"):

- The last task Slurm starts from a job array's own record keeps the array's id as its
  `SLURM_JOB_ID`. `scancel`, `scontrol requeue` or `sacct -j` on that id address every task of
  the array: they signal and requeue siblings that never asked, and fail on the finished ones.
  A task's own id is `<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>`, for every task alike.
- `SLURM_JOB_ID` is also set inside an `salloc` shell and inside any sbatch script: its presence
  does not mean that this process is a job this tool submitted. A point of a local sweep started
  there must never signal, requeue or bill the user's own job.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmJob:
    """The Slurm job a point runs as, when this tool submitted it to Slurm."""

    job_id: str
    """The job's own id: "55_2" for task 2 of array 55 (whatever SLURM_JOB_ID says), else "56"."""
    name: str | None
    """SLURM_JOB_NAME: sacct rows of other jobs are ignored by it (ids restart on a fresh cluster)."""
    nodelist: str
    """SLURM_JOB_NODELIST."""
    array_task_id: str
    """SLURM_ARRAY_TASK_ID, "" for a job that is not an array task."""
    restart_count: int
    """SLURM_RESTART_COUNT: how many times Slurm requeued this job (0 on the first allocation)."""
    cluster: str = ""
    """SLURM_CLUSTER_NAME: the cluster it runs on. Its own Slurm calls need no -M: slurmd sets
    the job's SLURM_CONF to that cluster's, whichever login node submitted it."""


def task_id(env: Mapping[str, str]) -> str:
    """The id Slurm knows this job by, for itself alone: "55_2" for an array task, else
    SLURM_JOB_ID; "" outside a Slurm job."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "")


def this_job(env: Mapping[str, str] | None = None) -> SlurmJob | None:
    """The Slurm job this process is, from its environment; None outside Slurm. Only the
    Slurm scheduler asks (pipeline.sched.slurm): a point of the local launcher has no Slurm
    job even where SLURM_JOB_ID is set (an salloc shell, an sbatch script: the user's job)."""
    env = os.environ if env is None else env
    job_id = task_id(env)
    if not job_id:
        return None
    restarts = env.get("SLURM_RESTART_COUNT", "0")
    return SlurmJob(
        job_id=job_id,
        name=env.get("SLURM_JOB_NAME") or None,
        nodelist=env.get("SLURM_JOB_NODELIST", ""),
        array_task_id=env.get("SLURM_ARRAY_TASK_ID", ""),
        restart_count=int(restarts) if restarts.isdigit() else 0,
        cluster=env.get("SLURM_CLUSTER_NAME", ""),
    )


def sweep_job_name(sweep_id: str) -> str:
    """Every job of a sweep has this name: status and billing match Slurm's rows on it, since
    job ids restart at 1 on a fresh cluster."""
    return f"sq-{sweep_id}"


def job_ref(cluster: str | None, job_id: str) -> str:
    """How the sweep records a job of a cluster other than its login node's: `<cluster>:<id>`
    (job ids are each cluster's own: two clusters can both have a job 12). A job of the login
    node's own cluster is its bare id, as before multi-cluster operation. Slurm's job ids and
    array task ids never hold a colon, so the reference reads back unambiguously."""
    return f"{cluster}:{job_id}" if cluster and job_id else job_id


def split_ref(ref: str) -> tuple[str | None, str]:
    """(cluster, job id) of a `job_ref`; (None, id) for a bare id."""
    cluster, sep, job_id = ref.rpartition(":")
    return (cluster, job_id) if sep and cluster else (None, ref)
