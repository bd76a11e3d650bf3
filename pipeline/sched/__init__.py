"""The scheduler interface (docs/design.md, "Schedulers"): one `Scheduler` protocol (`base`),
implemented by the local launcher (`local`) and by Slurm (`slurm`, which delegates every client
call to pipeline.slurm), chosen once per sweep (`choose`). Everything else asks the scheduler
object and compares no launcher strings. Torch-free: the login node and the job both use it.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import
`slurm`, `config.schema`; never torch, deepspeed, transformers, peft, bitsandbytes, mlflow, submitit, hydra.
"""

from pipeline.sched.base import (
    Allocation,
    JobIdentity,
    JobState,
    LauncherKind,
    OneTaskJob,
    Scheduler,
    SchedulerError,
    SchedulerTimeout,
)
from pipeline.sched.choose import LOCAL, SLURM, choose, scheduler_for, scheduler_of, scheduler_on, this_job
from pipeline.sched.local import LocalScheduler
from pipeline.sched.slurm import SlurmScheduler
from pipeline.slurm.cluster import (
    REQUEUE_STATES,
    RUNNING_STATES,
    ClusterIdentity,
    ClusterInfo,
    NodeInfo,
    PartitionInfo,
    SubmitLimit,
)
from pipeline.slurm.job import job_ref, split_ref, sweep_job_name

__all__ = [
    "LOCAL",
    "REQUEUE_STATES",
    "RUNNING_STATES",
    "SLURM",
    "Allocation",
    "ClusterIdentity",
    "ClusterInfo",
    "JobIdentity",
    "JobState",
    "LauncherKind",
    "LocalScheduler",
    "NodeInfo",
    "OneTaskJob",
    "PartitionInfo",
    "SubmitLimit",
    "Scheduler",
    "SchedulerError",
    "SchedulerTimeout",
    "SlurmScheduler",
    "choose",
    "scheduler_for",
    "scheduler_of",
    "scheduler_on",
    "job_ref",
    "split_ref",
    "sweep_job_name",
    "this_job",
]
