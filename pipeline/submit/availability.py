"""The login node's answer to the report's question "when would a job of the production shape
start on this partition" (analysis.availability.AskStart): the scheduler that answers on this
machine (Slurm's `sbatch --test-only` where `sinfo` answers, else the local launcher, which has
no queue to ask). The report runs no scheduler command itself."""

from __future__ import annotations

from functools import cache
from typing import Any

from pipeline.config.schema import LauncherConfig
from pipeline.sched import Scheduler, choose, scheduler_for, scheduler_on


@cache
def _scheduler() -> Scheduler:
    kind, _ = choose(LauncherConfig())  # auto: Slurm where it answers
    return scheduler_for(kind)


def ask_start(partition: str, nodes: int, gpus_per_node: int, time_limit_min: int, cluster: str = "") -> Any:
    """The scheduler's dated start estimate (pipeline.slurm.cluster.StartEstimate) for the shape;
    `cluster`: the partition's cluster when it is another of this login node's slurmdbd (-M)."""
    sched = _scheduler()
    if cluster:
        sched = scheduler_on(sched.kind, cluster)
    return sched.start_estimate(partition, nodes, gpus_per_node, time_limit_min)
