"""A sweep after it was submitted: `qualify cancel` and `qualify resume`, on the login node.

- cancel: every job of the sweep that Slurm still holds (queued, running, requeued) is
  cancelled, one `scancel` per job array (the scheduler's `cancel`); every point
  without a final outcome ends failed `cancelled`, its MLflow run KILLED; the parent run closes
  with its summary. A running job gets Slurm's SIGTERM first: it saves at its next step
  boundary and leaves (docs/design.md, "The life of an attempt"), so a resume continues from
  there. On the local launcher the sweep's own process is interrupted (Ctrl-C): its points end
  `interrupted`. An adaptive Slurm sweep's rounds are stopped first and its controller jobs
  cancelled (pipeline/submit/controller.py `stop`). Idempotent: a sweep with nothing left to
  cancel is left as it is.
- resume: the points that ended for a reason outside the candidate (`RESUMABLE`, or `--only`)
  run again, in the same sweep folder and the same MLflow runs (reopened), each from its last
  checkpoint (the job loads the newest one that checks out); the parent run is reopened and
  closes again when they end. Points still in Slurm, accepted, or failed for the candidate's
  own reasons are left alone, so a second resume submits nothing.

Torch-free.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.parent import close_if_done, parent_lock
from pipeline.contract.pointdir import PointDir
from pipeline.contract.sweepdir import SweepDir
from pipeline.sched import Scheduler, SchedulerError, scheduler_for, sweep_job_name
from pipeline.submit.manifest import Manifest, PointEntry
from pipeline.submit.status import PointStatus, alive, point_states, record_stopped
from pipeline.tracking import keys as K

RESUMABLE = (
    Reason.INTERRUPTED,
    Reason.CANCELLED,
    Reason.NODE_UNHEALTHY,
    Reason.PREEMPT_CANCELLED,
    Reason.TOOL_ERROR,
    Reason.DISK_FULL,
)
"""Endings outside the candidate: a resume runs these points again unless told otherwise."""
LEAVE_SLURM_S = 60.0  # how long cancel waits for the cancelled jobs to leave Slurm


@dataclass
class CancelResult:
    cancelled_jobs: list[str]
    cancelled_points: list[str]
    closed: bool


def _live_jobs(sched: Scheduler, m: Manifest) -> list[str]:
    """The sweep's jobs Slurm still holds (queued, running, requeued, tearing down)."""
    ids = [p.job_id for p in m.points if p.job_id]
    states = sched.job_states(ids, job_name=sweep_job_name(m.sweep_id))
    if states is None:
        raise SchedulerError("Slurm did not answer sacct or squeue: nothing was cancelled")
    return [j for j in ids if (js := states.get(j)) is not None and js.in_slurm]


def cancel_sweep(sweep_dir: Path) -> CancelResult:
    """Cancel what still runs of a sweep (see the module's docstring)."""
    m = Manifest.read(sweep_dir)
    sched = scheduler_for(m.launcher)
    if not sched.keeps_jobs:
        return _cancel_local(sweep_dir, m)
    controllers: list[str] = []
    if SweepDir(sweep_dir).adaptive_state.exists():  # its controllers first: none may submit a round
        from pipeline.submit.controller import stop

        controllers = stop(sweep_dir, sched, by="qualify cancel")
        m = Manifest.read(sweep_dir)  # a round a controller was submitting is in it now
    live = _live_jobs(sched, m)
    if live:
        sched.cancel(live)
        deadline = time.monotonic() + LEAVE_SLURM_S
        while _live_jobs(sched, m) and time.monotonic() < deadline:  # the SIGTERM'd jobs save and leave
            time.sleep(1.0)
    ended = []
    for entry in m.points:
        if PointDir(entry.point_dir).read_outcome() is None:
            record_stopped(entry, m, Reason.CANCELLED, f"cancelled by qualify cancel (job {entry.job_id})")
            ended.append(entry.point_id)
    closed = bool(live or ended) and close_if_done(sweep_dir, by="qualify cancel", status="KILLED")
    return CancelResult(controllers + live, ended, closed)


def _cancel_local(sweep_dir: Path, m: Manifest) -> CancelResult:
    """The local sweep's process runs its points: interrupt it as Ctrl-C would (it ends the
    running point, records the others `interrupted`, closes the parent KILLED), and wait."""
    if m.submit_host and m.submit_host != socket.gethostname():
        raise SchedulerError(f"sweep {m.sweep_id} runs on {m.submit_host}, not here: cancel it there")
    pid = m.submit_pid
    if not alive(pid):
        return CancelResult([], [], False)
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    return CancelResult([str(pid)], [p.point_id for p in Manifest.read(sweep_dir).points], True)


def resumable(sweep_dir: Path, only: Sequence[str] = RESUMABLE) -> list[PointEntry]:
    """The points a resume runs again: final (their job has left Slurm), ended for one of
    `only`'s reasons. Asks Slurm once (status's own reconciliation records lost points)."""
    m = Manifest.read(sweep_dir)
    if (
        not scheduler_for(m.launcher).keeps_jobs
        and m.submit_host == socket.gethostname()
        and alive(m.submit_pid)
    ):
        return []  # the local sweep still runs them
    chosen = []
    for s in point_states(m, sweep_dir):
        reason = (s.outcome or {}).get("reason", "")
        if s.state in (PointStatus.FAILED, PointStatus.ERROR) and reason in only:
            chosen.append(s.entry)
    return chosen


def reopen(sweep_dir: Path, entries: Sequence[PointEntry]) -> Manifest:
    """Make the chosen points run again: their outcome and bill go (the attempt records and
    checkpoints stay: the job resumes from them), their MLflow runs and the parent's are
    RUNNING again (through their ledgers), and the parent's closed marker goes."""
    from pipeline.contract.parent import parent_tracker
    from pipeline.tracking.ledger import LedgerDir, Tracker

    m = Manifest.read(sweep_dir)
    for entry in entries:
        point = PointDir(entry.point_dir)
        point.clear_outcome()
        point.mark_resubmitted()
        point.billed.unlink(missing_ok=True)
        if m.tracking_uri and LedgerDir(point.tracking).read_run_id():
            run = Tracker(
                m.tracking_uri, m.experiment, point.tracking, run_name=entry.point_id, background=False
            )
            run.set_tags({K.TAG_OUTCOME: Outcome.SUBMITTED, K.TAG_REASON: "", K.TAG_REASON_DETAIL: ""})
            run.reopen()
            run.close(terminate=False)
    with parent_lock(sweep_dir):
        SweepDir(sweep_dir).parent_closed.unlink(missing_ok=True)
        if m.tracking_uri:
            parent = parent_tracker(m.tracking_uri, m.experiment, m.sweep_id, sweep_dir)
            parent.reopen()
            parent.close(terminate=False)
    return m
