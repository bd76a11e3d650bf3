"""Where a sweep stands, from its manifest, its points' outcome files and Slurm's accounting:
survives a closed terminal, needs no MLflow, and records points whose job died silently."""

from __future__ import annotations

import logging
import os
import socket
import statistics
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.parent import close_if_done
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptRecord
from pipeline.contract.sweepdir import SweepDir
from pipeline.files import read_json, write_json
from pipeline.sched import REQUEUE_STATES, RUNNING_STATES, JobState, scheduler_for, sweep_job_name
from pipeline.submit.manifest import Manifest, PointEntry, parent_status
from pipeline.submit.names import WIDTH, point_names
from pipeline.tracking import keys as K
from pipeline.tracking.ledger import LedgerDir, Tracker

log = logging.getLogger(__name__)


class PointStatus(str, Enum):
    """Where a point stands in `qualify status`. The final ones are its outcome (the values of
    the sq.outcome tag, from tracking/keys.py); the others come from Slurm or the local
    processes. Compares and hashes as its value."""

    PENDING = "pending"  # queued, never started (or its sweep's process still submits it)
    RUNNING = Outcome.RUNNING
    REQUEUED = "requeued"  # between attempts: Slurm will run its job again
    ACCEPTED = Outcome.ACCEPTED
    FAILED = Outcome.FAILED
    ERROR = Outcome.ERROR
    # a local point of another machine's sweep (its processes are not visible here), or one whose
    # sweep died as it submitted it (no job id recorded, a job of the sweep's alive): it may run
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def of_outcome(cls, outcome: dict[str, Any]) -> PointStatus:
        """The status an outcome file states (unknown for a value no job writes)."""
        try:
            return cls(outcome.get("outcome"))
        except ValueError:
            return cls.UNKNOWN


FINAL = (PointStatus.ACCEPTED, PointStatus.FAILED, PointStatus.ERROR)
TABLE_COLUMNS = (
    PointStatus.PENDING,
    PointStatus.RUNNING,
    PointStatus.REQUEUED,
    PointStatus.ACCEPTED,
    PointStatus.FAILED,
    PointStatus.ERROR,
)
"""The status table's columns, in order (an unknown point is in no column)."""
# Slurm states of a job that will not run again (unless it requeued itself), and the reason a
# point gets when its job ended in one of them without writing an outcome
SLURM_ENDED = {
    "COMPLETED": Reason.CRASH,
    "FAILED": Reason.CRASH,
    "CANCELLED": Reason.CANCELLED,
    "TIMEOUT": Reason.TIMEOUT,
    "DEADLINE": Reason.TIMEOUT,
    "NODE_FAIL": Reason.CRASH,
    "BOOT_FAIL": Reason.CRASH,
    "OUT_OF_MEMORY": Reason.OOM,
    "PREEMPTED": Reason.PREEMPT_CANCELLED,
}
# a job's outcome file may reach a shared file system a little after the job ends: wait
# this long after the end before calling the point lost
LOST_GRACE_S = 5.0
STATUS_CACHE = SweepDir.STATUS_CACHE  # the file name (SweepDir owns the path)
# a job that left a stop record (it asked Slurm to requeue it) within this long of its record's
# end is between attempts, for at most REQUEUE_WAIT_S after that end
STOP_SLACK_S = 60.0
REQUEUE_WAIT_S = 300.0
# the Slurm answer of a sweep is shared by its watchers (runs/<sweep>/.status_cache.json):
# a poll reuses one younger than its interval; a single `qualify status` one younger than this
MIN_QUERY_INTERVAL_S = 5.0


def read_outcome(entry: PointEntry) -> dict[str, Any] | None:
    return PointDir(entry.point_dir).read_outcome()


def record_lost_point(
    entry: PointEntry,
    detail: str,
    tracking_uri: str | None = None,
    parent: str | None = None,
    reason: str = Reason.CRASH,
    experiment: str | None = None,
    sweep_id: str = "",
    run_status: str = "FAILED",
) -> dict[str, Any]:
    """A job that ended without an outcome (killed, cancelled, node failure, an interrupted
    local sweep): failed with `reason`, ended in MLflow with `run_status` (when it answers; the
    point's ledger keeps it otherwise), then written to the point's outcome file: the run ends
    before the outcome exists, so whoever closes the parent run closes it after."""
    summary = {
        "point_id": entry.point_id,
        "candidate": entry.candidate,
        "outcome": Outcome.FAILED,
        "reason": reason,
        "detail": detail,
        "metrics": {},
    }
    point = PointDir(entry.point_dir)
    meta = LedgerDir(point.tracking).read_meta()
    uri = tracking_uri or meta.get("uri")
    if uri:
        try:
            exp = experiment or meta.get("experiment", K.EXPERIMENT)
            _mark_run_failed(uri, exp, sweep_id, entry, point, parent, detail, reason, run_status)
        except Exception as e:  # status must work without MLflow
            log.warning("could not record %s in MLflow: %s", entry.point_id, e)
    point.write_outcome(summary)
    return summary


def _mark_run_failed(
    uri: str,
    experiment: str,
    sweep_id: str,
    entry: PointEntry,
    point: PointDir,
    parent: str | None,
    detail: str,
    reason: str,
    run_status: str = "FAILED",
) -> None:
    tags = {
        K.TAG_PARENT_KIND: "point",
        **({K.TAG_SWEEP_ID: sweep_id} if sweep_id else {}),
        K.TAG_POINT_ID: entry.point_id,
        K.TAG_CANDIDATE: entry.candidate,
        K.TAG_PARTITION: entry.partition,
        K.TAG_DRILLS: entry.drills,
        K.TAG_OUTCOME: Outcome.FAILED,
        K.TAG_REASON: reason,
        K.TAG_REASON_DETAIL: detail,
    }
    # through the point's ledger: into the job's run if it made one, kept for `qualify sync`
    # when MLflow does not answer
    point.tracking.mkdir(parents=True, exist_ok=True)
    tracker = Tracker(
        uri,
        experiment,
        point.tracking,
        run_name=entry.point_id,
        parent_run_id=parent,
        parent_dir=SweepDir.of_point(point).parent_ledger,
        background=False,
    )
    tracker.set_tags(tags)
    tracker.close(run_status)


@dataclass
class PointState:
    entry: PointEntry
    state: PointStatus
    outcome: dict[str, Any] | None
    attempts: int = 0  # attempts that ended (a requeued point is in attempt attempts + 1)
    queue_wait_s: float | None = None  # its job's latest allocation waited this long (Slurm only)


def slurm_states(m: Manifest, sweep_dir: Path | None = None, max_age_s: float = 0.0) -> dict[str, JobState]:
    """Slurm's state of every job of the sweep: one sacct and one squeue call for the whole
    sweep, shared through `<sweep>/.status_cache.json` by every watcher: an answer younger than
    `max_age_s` is reused, and one watcher at a time asks (the others wait for its answer)."""
    sched = scheduler_for(m.launcher)
    ids = [p.job_id for p in m.points if p.job_id]
    if sweep_dir is None or max_age_s <= 0:
        return sched.job_states(ids, job_name=sweep_job_name(m.sweep_id)) or {}
    import fcntl

    sd = SweepDir(sweep_dir)
    with open(sd.status_lock, "a") as lock:  # a lock, never written
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        cached = read_json(sd.status_cache)
        now = time.time()
        if isinstance(cached, dict) and 0 <= now - cached.get("time", 0) < max_age_s:
            return {
                j: JobState(st, None if end is None else max(0.0, now - end), live, (wait or [None])[0])
                for j, (st, end, live, *wait) in cached["jobs"].items()
            }
        states = sched.job_states(ids, job_name=sweep_job_name(m.sweep_id)) or {}
        now = time.time()
        jobs = {
            j: (js.state, None if js.ended_s_ago is None else now - js.ended_s_ago, js.live, js.queue_wait_s)
            for j, js in states.items()
        }
        if states or not ids:  # a silence is not cached
            write_json(sd.status_cache, {"time": now, "jobs": jobs})
        return states


def _requeued_itself(point: PointDir, attempts: list[AttemptRecord], js: JobState) -> bool:
    """The job stopped to be requeued (its stop record, or its last attempt's record, says so)
    when this ended record ended, and not so long ago that Slurm must have dropped it."""
    if js.ended_s_ago is None or js.ended_s_ago > REQUEUE_WAIT_S:
        return False
    record_end = time.time() - js.ended_s_ago
    stop = point.read_stop() or {}
    last = attempts[-1] if attempts else AttemptRecord()
    times = [stop.get("exit_time"), last.end if last.stop else None]
    return any(isinstance(t, int | float) and t >= record_end - STOP_SLACK_S for t in times)


def _slurm_point(entry: PointEntry, js: JobState | None, m: Manifest) -> PointState:
    """A Slurm point without an outcome. Lost (recorded failed) only when Slurm says its job
    will not run again: its latest record is final, no requeue is pending, the grace passed."""
    point = PointDir(entry.point_dir)
    attempts = AttemptRecord.read_all(point.attempts())
    n = len(attempts)
    if js is None:
        return PointState(entry, PointStatus.PENDING, None, n)
    between = PointStatus.REQUEUED if n or point.read_stop() else PointStatus.PENDING
    if js.live:
        return PointState(entry, PointStatus.RUNNING if js.state in RUNNING_STATES else between, None, n)
    if js.state in REQUEUE_STATES:
        return PointState(entry, between, None, n)
    if js.state in RUNNING_STATES:
        return PointState(entry, PointStatus.RUNNING, None, n)
    if js.state not in SLURM_ENDED:
        return PointState(entry, PointStatus.PENDING, None, n)
    if _requeued_itself(point, attempts, js):
        return PointState(entry, PointStatus.REQUEUED, None, n)
    if (js.ended_s_ago or 0.0) < LOST_GRACE_S:  # ended a moment ago: its outcome may follow
        return PointState(entry, PointStatus.RUNNING, None, n)
    outcome = point.read_outcome()  # written since the first look?
    if outcome is None:
        outcome = record_lost_point(
            entry,
            f"Slurm job {entry.job_id} ended {js.state} without an outcome",
            m.tracking_uri,
            m.parent_run_id,
            reason=SLURM_ENDED[js.state],
            experiment=m.experiment,
            sweep_id=m.sweep_id,
        )
    return PointState(entry, PointStatus.of_outcome(outcome), outcome, n)


def alive(pid: int) -> bool:
    """A process of this host with that id exists (0 and below: none)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _local_point(entry: PointEntry, m: Manifest) -> PointState:
    """A local point without an outcome: running while its process lives (the job id the sweep
    recorded, or the pid its rank 0 wrote in progress.json), pending while the sweep's process
    lives; unknown ("submitting") while the sweep, killed as it submitted this point, left a live
    job it did not record; with none of these, the sweep was interrupted: failed, its run KILLED."""
    point = PointDir(entry.point_dir)
    n = len(point.attempts())
    if m.submit_host and m.submit_host != socket.gethostname():
        return PointState(entry, PointStatus.UNKNOWN, None, n)  # another machine's processes
    if entry.job_id.isdigit() and alive(int(entry.job_id)):
        return PointState(entry, PointStatus.RUNNING, None, n)
    if alive(m.submit_pid):
        return PointState(entry, PointStatus.PENDING, None, n)
    pid = (point.read_progress() or {}).get("pid")
    if isinstance(pid, int) and alive(pid):
        return PointState(entry, PointStatus.RUNNING, None, n)
    if not entry.job_id and _submitting(entry, m):
        return PointState(entry, PointStatus.UNKNOWN, None, n)
    outcome = point.read_outcome() or record_stopped(entry, m)
    return PointState(entry, PointStatus.of_outcome(outcome), outcome, n)


def _submitting(entry: PointEntry, m: Manifest) -> bool:
    """`entry` is the point a dead local sweep was submitting (the first without a job id: the
    points run one at a time, in order) and a job of the sweep it never recorded still lives:
    submitit's local job id is its controller's pid, which names its files in submitit/."""
    first = next((p for p in m.points if not p.job_id and read_outcome(p) is None), None)
    if first is not entry:
        return False
    folder = SweepDir.of_point(PointDir(entry.point_dir)).submitit
    recorded = {p.job_id for p in m.points}
    pids = {f.name.split("_", 1)[0] for f in folder.glob("*_*")} if folder.is_dir() else set()
    return any(p.isdigit() and p not in recorded and alive(int(p)) for p in pids)


def record_stopped(
    entry: PointEntry,
    m: Manifest,
    reason: str = Reason.INTERRUPTED,
    detail: str = "the local sweep was interrupted before this point ended",
) -> dict[str, Any]:
    """A point a person stopped before it ended (Ctrl-C, `qualify cancel`): failed with
    `reason`, its run KILLED."""
    return record_lost_point(
        entry,
        detail,
        m.tracking_uri,
        m.parent_run_id,
        reason=reason,
        experiment=m.experiment,
        sweep_id=m.sweep_id,
        run_status="KILLED",
    )


def point_states(
    m: Manifest,
    sweep_dir: Path | None = None,
    max_age_s: float = 0.0,
    slurm: dict[str, JobState] | None = None,
) -> list[PointState]:
    """State of every point: its outcome file once its job has left Slurm for good (a job
    still in squeue, or whose latest record runs or awaits a requeue, is live whatever its
    outcome file says: Slurm may run it again), else its job's state (Slurm's, from one sacct
    and one squeue call, or the local processes'); a job that will not run again and ended
    without an outcome is recorded as failed (file and MLflow) here."""
    queued = scheduler_for(m.launcher).keeps_jobs
    if queued and slurm is None:
        slurm = slurm_states(m, sweep_dir, max_age_s)
    states = []
    for entry in m.points:
        outcome = read_outcome(entry)
        js = (slurm or {}).get(entry.job_id) if queued else None
        if outcome is not None and (js is None or not js.in_slurm):
            state = PointState(entry, PointStatus.of_outcome(outcome), outcome)
        elif queued:
            state = _slurm_point(entry, js, m)
        else:
            state = _local_point(entry, m)
        states.append(replace(state, queue_wait_s=js.queue_wait_s) if js is not None else state)
    return states


def bar(done: int, total: int, width: int = 24) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + f"] {done}/{total}"


def status_table(m: Manifest, states: list[PointState]) -> str:
    by_part: dict[str, Counter[str]] = defaultdict(Counter)
    for s in states:
        by_part[s.entry.partition][s.state] += 1
    cols = TABLE_COLUMNS
    lines = [f"sweep {m.sweep_id} ({m.sweep}, {m.launcher}): {len(states)} points", ""]
    lines.append(f"{'partition':<12}" + "".join(f"{c:>10}" for c in cols) + "  progress")
    for part in sorted(by_part):
        c = by_part[part]
        total = sum(c.values())
        lines.append(
            f"{part:<12}" + "".join(f"{c[k]:>10}" for k in cols) + "  " + bar(sum(c[k] for k in FINAL), total)
        )
    done = sum(s.state in FINAL for s in states)
    lines += ["", "all     " + bar(done, len(states))]
    requeued = [s for s in states if s.state == PointStatus.REQUEUED]
    if requeued:
        lines.append(
            "requeued (between attempts): "
            + ", ".join(f"{s.entry.point_id} (attempt {s.attempts + 1} next)" for s in requeued[:20])
            + (f" and {len(requeued) - 20} more" if len(requeued) > 20 else "")
        )
    if unknown := [s.entry.point_id for s in states if s.state == PointStatus.UNKNOWN]:
        lines.append(
            "submitting / unknown (no job id recorded, or another machine's processes: its job may run): "
            + ", ".join(unknown[:20])
            + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
        )
    return "\n".join(lines + queue_wait_lines(states) + live_lines(states) + ended_badly(states))


def queue_wait_lines(states: list[PointState]) -> list[str]:
    """Each partition's median queue wait so far (sacct Eligible -> Start of its jobs' latest
    allocations); nothing where no job has started from a queue (the local launcher)."""
    waits: dict[str, list[float]] = defaultdict(list)
    for s in states:
        if s.queue_wait_s is not None:
            waits[s.entry.partition].append(s.queue_wait_s)
    if not waits:
        return []
    parts = [f"{part} {statistics.median(w) / 60:.1f} min (n={len(w)})" for part, w in sorted(waits.items())]
    return ["queue wait so far (median, sacct Eligible -> Start): " + ", ".join(parts)]


def ended_badly(states: list[PointState], most: int = 20) -> list[str]:
    """One line per point that ended failed or in error: its reason and the detail (for an
    exception, its type and first line; the traceback is the run's artifact traceback.txt)."""
    bad = [s for s in states if s.state in (PointStatus.FAILED, PointStatus.ERROR) and s.outcome]
    lines = [
        f"{s.state} {s.entry.point_id}: {s.outcome.get('reason') or 'no reason'}"
        + (f": {s.outcome['detail'][:200]}" if s.outcome.get("detail") else "")
        for s in bad[:most]
        if s.outcome is not None
    ]
    if len(bad) > most:
        lines.append(f"... and {len(bad) - most} more")
    return ["", *lines] if lines else []


def fmt(value: Any, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def summary_table(states: list[PointState]) -> str:
    """One line per point with the numbers a reviewer looks at first."""
    names = point_names([s.entry for s in states])
    w = max([WIDTH, *map(len, names)])
    head = f"{'point':<{w}} {'outcome':<9} {'reason':<22} {'tok/s':>9} {'p50 s':>8} {'CV':>6} {'MFU*':>6} {'peak GiB':>8} {'save s':>7} {'load s':>7} {'verified':>8}"
    lines = [head, "-" * len(head)]
    for s, name in zip(states, names, strict=True):
        mt = (s.outcome or {}).get("metrics", {})
        lines.append(
            f"{name:<{w}} {s.state:<9} {(s.outcome or {}).get('reason', '')[:22]:<22} "
            f"{fmt(mt.get(K.PERF_TOKENS_PER_S), '.0f'):>9} {fmt(mt.get(K.PERF_STEP_P50_S), '.4f'):>8} "
            f"{fmt(mt.get(K.PERF_STEP_CV), '.2f'):>6} {fmt(mt.get(K.PERF_MFU_VS_CEILING), '.2f'):>6} "
            f"{fmt(mt.get(K.MEM_PEAK_ALLOCATED_GIB, mt.get(K.MEM_PEAK_RSS_GIB)), '.2f'):>8} "
            f"{fmt(mt.get(K.CKPT_SAVE_S), '.3f'):>7} {fmt(mt.get(K.CKPT_LOAD_S), '.3f'):>7} "
            f"{('yes' if mt.get(K.CKPT_VERIFIED) == 1.0 else 'no' if K.CKPT_VERIFIED in mt else '-'):>8}"
        )
    lines.append(
        "MFU* = model FLOP/s over the measured matmul ceiling (catalog MFU is in MLflow for GPU runs)."
    )
    return "\n".join(lines)


def watch(sweep_dir: Path, follow: bool, interval_s: float = 30.0, out: Any = None) -> list[PointState]:
    """Print the table; with follow, redraw every `interval_s` until every point is accepted or
    failed (and, on Slurm, until their jobs ended and were billed from sacct, for at most
    BILL_WAIT_S). Each poll makes one sacct and one squeue call for the whole sweep, shared
    with the sweep's other watchers (an answer younger than the interval is reused). `out`: a
    stream, default the sys.stdout of the call (not of the import)."""
    out = sys.stdout if out is None else out
    max_age = interval_s if follow else MIN_QUERY_INTERVAL_S
    done_at: float | None = None
    while True:
        m = Manifest.read(sweep_dir)
        if m.error:  # submission failed: nothing of this sweep runs
            out.write(f"sweep {m.sweep_id} was not submitted: {m.error}\n")
            out.flush()
            return []
        queued = scheduler_for(m.launcher).keeps_jobs
        slurm = slurm_states(m, sweep_dir, max_age) if queued else None
        states = point_states(m, slurm=slurm)
        text = status_table(m, states)
        done = all(s.state in FINAL for s in states)
        if follow and out.isatty():
            out.write("\033[2J\033[H")
        out.write(text + "\n")
        out.flush()
        if done and queued:
            done_at = done_at or time.monotonic()
            if _bill(m, slurm or {}) and follow and time.monotonic() - done_at < BILL_WAIT_S:
                time.sleep(min(interval_s, 2.0))  # a job still tearing down: bill it once it ended
                continue
        if done:
            close_if_done(sweep_dir, by=f"status pid {os.getpid()}")
        if done or not follow:
            return states
        time.sleep(interval_s)


BILL_WAIT_S = 120.0  # how long a following watch waits for ended points' jobs to leave Slurm


def _bill(m: Manifest, slurm: dict[str, JobState]) -> int:
    """Bill the ended Slurm points from sacct's final figures; how many jobs have not ended."""
    from pipeline.submit.billing import bill_ended_points

    return bill_ended_points(m, slurm)


def final_status(ledger_dir: Path) -> str | None:
    """The status a run ends with after `qualify sync`: a point's from its outcome file
    (FINISHED when accepted, else FAILED), the sweep's parent from its manifest; None while
    the point or the sweep still runs."""
    folder = Path(ledger_dir).parent
    if SweepDir(folder).manifest.exists():
        return parent_status(folder)
    outcome = PointDir(folder).read_outcome()
    if outcome is None:
        return None
    return "FINISHED" if outcome.get("outcome") == Outcome.ACCEPTED else "FAILED"


# --- progress of the running points, and the time left ------------------------------------
LIVE_LINES = 20  # running points listed one per line, at most
STALE_S = 60.0  # a progress file older than this is shown with its age


def duration(seconds: float) -> str:
    """4s, 3m05s, 2h07m."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def phase_text(progress: dict[str, Any] | None, now: float) -> str:
    """What a running point is doing, from its progress.json (pipeline/job/progress.py)."""
    if not progress:
        return "starting (the job's process is up; no progress reported yet)"
    phase, detail = progress.get("phase", "?"), progress.get("detail") or ""
    step, steps, pace = progress.get("step"), progress.get("steps"), progress.get("step_time_s")
    # a drill's steps (the reference run) come with its label alone as detail: "reference run"
    if phase in ("training", "drill") and step and steps and (phase == "training" or ":" not in detail):
        text = f"{'drill: ' + detail + ' ' if phase == 'drill' else 'training '}step {step}/{steps}"
        text += f", {pace:.3g} s/step" if pace else ""
        text += f" ({detail})" if phase == "training" and detail else ""
    else:
        since = progress.get("phase_since")
        text = f"{phase}: {detail}" if detail else phase
        text += f" ({duration(now - since)} so far)" if isinstance(since, int | float) else ""
    attempt = progress.get("attempt")
    if isinstance(attempt, int) and attempt > 0:
        text += f", attempt {attempt + 1}"
    written = progress.get("time")
    if isinstance(written, int | float) and now - written > STALE_S:
        text += f" [reported {duration(now - written)} ago]"
    return text


@dataclass(frozen=True)
class Eta:
    """The sweep's time left (None when it cannot be estimated) and how it was estimated."""

    seconds: float | None
    how: str

    def text(self) -> str:
        if self.seconds is None:
            return f"time left: not estimated yet ({self.how})"
        return f"time left: about {duration(self.seconds)} ({self.how})"


def point_left_s(progress: dict[str, Any] | None) -> float | None:
    """A running point's training steps left x its pace (the median of its latest step times),
    plus its reference run's steps at that pace when one follows; None before its first step."""
    if not progress:
        return None
    step, steps, pace = progress.get("step"), progress.get("steps"), progress.get("step_time_s")
    if not (isinstance(steps, int) and isinstance(step, int) and isinstance(pace, int | float)):
        return None
    return (max(0, steps - step) + int(progress.get("drill_steps") or 0)) * float(pace)


def ended_wall_s(entry: PointEntry) -> float | None:
    """How long an ended point took: its attempts' allocated time (the job's clock); None for a
    point that ended without running (no attempt record)."""
    attempts = AttemptRecord.read_all(PointDir(entry.point_dir).attempts())
    total = sum(float(a.allocated_s or 0.0) for a in attempts)
    return total or None


def sweep_eta(states: list[PointState], now: float) -> Eta:
    """Time left = the larger of the slowest running point's time left and all the work left
    (every running point's time left + each queued or requeued point x the median time of the
    ended points, or before any ended, of the running points' projected totals) spread over as
    many points at a time as run now."""
    running = [s for s in states if s.state == PointStatus.RUNNING]
    waiting = sum(s.state in (PointStatus.PENDING, PointStatus.REQUEUED) for s in states)
    if not running and not waiting:
        return Eta(0.0, "nothing left to run")
    ended = sorted(w for s in states if s.state in FINAL for w in [ended_wall_s(s.entry)] if w)
    per_point = statistics.median(ended) if ended else None
    lefts, totals = _running_left(running, per_point, now)
    if lefts is None:
        return Eta(None, f"{totals} has not finished a step and no point has ended")
    basis = f"the median time of {len(ended)} ended point(s)"
    if per_point is None and totals:
        per_point, basis = statistics.median(totals), "the running points' projected time"
    if waiting and per_point is None:
        return Eta(None, f"{waiting} queued and no time per point yet")
    at_once = max(1, len(running))
    work = sum(lefts) + waiting * (per_point or 0.0)
    how = ["steps left x each running point's pace"] if running else []
    if waiting:
        how.append(f"{waiting} queued x {duration(per_point or 0.0)}, {basis}")
    how.append(f"{at_once} at a time")
    return Eta(max([*lefts, work / at_once]), "; ".join(how))


def _running_left(running: list[PointState], per_point: float | None, now: float) -> tuple[Any, Any]:
    """(each running point's time left, each one's projected total: run so far + left), or
    (None, the id of a point whose time left is unknown)."""
    lefts: list[float] = []
    totals: list[float] = []
    for s in running:
        progress = PointDir(s.entry.point_dir).read_progress() or {}
        started = progress.get("started")
        so_far = now - started if isinstance(started, int | float) else None
        left = point_left_s(progress)
        if left is None and per_point is not None and so_far is not None:
            left = max(0.0, per_point - so_far)
        if left is None:
            return None, s.entry.point_id
        lefts.append(left)
        if so_far is not None:
            totals.append(so_far + left)
    return lefts, totals


def live_lines(states: list[PointState], now: float | None = None) -> list[str]:
    """One line per running point (its phase, step k/n, pace), the queued count, the ETA."""
    now = time.time() if now is None else now
    running = [s for s in states if s.state == PointStatus.RUNNING]
    lines = [
        f"running {s.entry.point_id}: {phase_text(PointDir(s.entry.point_dir).read_progress(), now)}"
        for s in running[:LIVE_LINES]
    ]
    if len(running) > LIVE_LINES:
        lines.append(f"... and {len(running) - LIVE_LINES} more running")
    queued = sum(s.state == PointStatus.PENDING for s in states)
    if queued:
        lines.append(f"queued: {queued} point(s)")
    if running or queued or any(s.state == PointStatus.REQUEUED for s in states):
        lines.append(sweep_eta(states, now).text())
    return ["", *lines] if lines else []
