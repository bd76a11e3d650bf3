"""Which scheduler runs a sweep: chosen once, when the sweep is planned (`choose`), recorded
in the manifest and in each point's spec as its `LauncherKind`, and looked up from there by
everyone after (`scheduler_for`)."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.config.schema import LauncherConfig
from pipeline.sched.base import JobIdentity, LauncherKind, Scheduler
from pipeline.sched.local import LocalScheduler
from pipeline.sched.slurm import SlurmScheduler

LOCAL = LocalScheduler()
SLURM = SlurmScheduler()  # this machine's cluster; a second cluster is a second instance


def scheduler_for(kind: str) -> Scheduler:
    """The scheduler of a recorded launcher kind (a manifest's, a spec's, a plan's)."""
    schedulers: dict[LauncherKind, Scheduler] = {LauncherKind.LOCAL: LOCAL, LauncherKind.SLURM: SLURM}
    return schedulers[LauncherKind(kind)]


def scheduler_on(kind: str, cluster: str) -> Scheduler:
    """The scheduler of `kind` addressing Slurm cluster `cluster` (another cluster of this login
    node's slurmdbd, with -M); `scheduler_for(kind)` for "" (the login node's own)."""
    sched = scheduler_for(kind)
    return sched.on(cluster) if cluster and isinstance(sched, SlurmScheduler) else sched


def scheduler_of(job: JobIdentity | None) -> Scheduler:
    """The scheduler whose job this is: a job identity comes from the Slurm scheduler alone
    (the local one never gives one), so no identity means the local one."""
    return LOCAL if job is None else SLURM


def this_job(kind: str, env: Mapping[str, str] | None = None) -> JobIdentity | None:
    """This process's own job under the scheduler of `kind` (None for the local launcher,
    whatever SLURM_JOB_ID says, and outside a Slurm job)."""
    return scheduler_for(kind).this_job(env)


def choose(cfg: LauncherConfig) -> tuple[LauncherKind, str]:
    """(kind, why) from the config's `launcher.kind`: "auto" asks whether Slurm answers here
    (sinfo). Said in one line at the start of a sweep."""
    if cfg.kind != "auto":
        return LauncherKind(cfg.kind), f"launcher.kind={cfg.kind}"
    if SLURM.answers():
        return LauncherKind.SLURM, "Slurm answers on this machine (sinfo)"
    return (
        LauncherKind.LOCAL,
        "no Slurm answers here (sinfo); the embedded default runs the points on this machine",
    )
