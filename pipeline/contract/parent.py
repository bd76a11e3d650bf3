"""The sweep's MLflow parent run, closed exactly once: by whoever first sees every point with an
outcome (the last job of the sweep as it ends, or any `qualify status` poll), under a lock file
in the sweep folder, after the last child run ended (a job ends its run before it writes its
outcome). Its summary (points by outcome and by partition) and its description are logged as it
closes. Torch-free: the job and the login node both call it; the sweep folder's paths and the
manifest's type are `pipeline.contract.sweepdir`'s."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.contract.outcome import FINAL, Outcome
from pipeline.contract.pointdir import PointDir
from pipeline.contract.sweepdir import Manifest, SweepDir
from pipeline.files import read_json, write_json
from pipeline.sched import REQUEUE_STATES, Scheduler, job_ref, scheduler_for, sweep_job_name
from pipeline.tracking import keys as K
from pipeline.tracking import store
from pipeline.tracking.ledger import Tracker

log = logging.getLogger(__name__)

MANIFEST = SweepDir.MANIFEST
PARENT_LEDGER = SweepDir.PARENT_LEDGER  # runs/<sweep>/tracking/: the parent run's ledger
CLOSED = SweepDir.PARENT_CLOSED  # who closed the parent run, and when (JSON)
REPORT_ARTIFACT = "report/report.md"  # where `make report` attaches the decision record (and .html)


class _NoTracking(Exception):
    pass


@contextlib.contextmanager
def parent_lock(sweep_dir: Path) -> Iterator[None]:
    """Held by whoever writes into the parent run's ledger (the sweep, a closer)."""
    with open(SweepDir(sweep_dir).parent_lock, "a") as f:  # a lock, never written
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def parent_tracker(
    uri: str, experiment: str, sweep_id: str, sweep_dir: Path, offline: bool = False
) -> Tracker:
    """The sweep's parent run, through its ledger like every job's run."""
    return Tracker(
        uri,
        experiment,
        SweepDir(sweep_dir).parent_ledger,
        run_name=f"sweep-{sweep_id}",
        background=False,
        offline=offline,
    )


def summary(outcomes: list[tuple[str, dict[str, Any]]]) -> dict[str, float]:
    """(partition, outcome) pairs as counts: sq.sweep.points.<outcome> and
    sq.sweep.points.<partition>.<outcome>, every outcome of the sweep present (0 counted)."""
    kinds = FINAL
    by_outcome = Counter(o.get("outcome", "") for _, o in outcomes)
    by_part = Counter((p, o.get("outcome", "")) for p, o in outcomes)
    out = {f"{K.SWEEP_POINTS_PREFIX}{k}": float(by_outcome[k]) for k in kinds}
    for part in sorted({p for p, _ in outcomes}):
        out.update({f"{K.SWEEP_POINTS_PREFIX}{part}.{k}": float(by_part[(part, k)]) for k in kinds})
    return out


def description(sweep_id: str, counts: dict[str, float], reasons: Counter[str]) -> str:
    """The parent run's description in the MLflow UI (markdown)."""
    acc = int(counts[f"{K.SWEEP_POINTS_PREFIX}{Outcome.ACCEPTED}"])
    fail = int(counts[f"{K.SWEEP_POINTS_PREFIX}{Outcome.FAILED}"])
    err = int(counts[f"{K.SWEEP_POINTS_PREFIX}{Outcome.ERROR}"])
    lines = [f"Sweep `{sweep_id}`: {acc + fail + err} points, {acc} accepted, {fail} failed."]
    if err:
        lines.append(
            f"{err} point(s) ended in a tool error (a defect of slurm-qualify or of its inputs, not a "
            "result of the partition): see their traceback.txt artifacts."
        )
    if reasons:
        lines.append("Failed by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) + ".")
    parts = sorted({k.removeprefix(K.SWEEP_POINTS_PREFIX).rpartition(".")[0] for k in counts} - {""})
    for part in parts:
        a = int(counts[f"{K.SWEEP_POINTS_PREFIX}{part}.{Outcome.ACCEPTED}"])
        f = int(counts[f"{K.SWEEP_POINTS_PREFIX}{part}.{Outcome.FAILED}"])
        lines.append(f"- `{part}`: {a} accepted, {f} failed")
    lines.append(
        f"Decision record: artifact `{REPORT_ARTIFACT}` (and `report/report.html`) of this run once "
        f"`make report SWEEP={sweep_id}` has run; the sweep's points: artifact `{MANIFEST}`."
    )
    return "\n".join(lines)


def close_if_done(
    sweep_dir: Path, by: str, status: str = "FINISHED", own_job: str | None = None, own_cluster: str = ""
) -> bool:
    """Close the parent run if every point of a submitted sweep has its outcome, Slurm will run
    none of a Slurm sweep's jobs again (`own_job`: the calling job, which is ending, on
    `own_cluster`: its SLURM_CLUSTER_NAME), and nobody closed it yet; True if this call closed
    it. Never raises for MLflow (the ledger keeps the events for `qualify sync`)."""
    sd = SweepDir(sweep_dir)
    try:
        m = Manifest.read(sd.path)
    except (OSError, ValueError, TypeError, KeyError):  # no manifest yet, or not one
        return False
    if m.error or not m.submitted or sd.parent_closed.exists():
        return False
    outcomes = []
    for p in m.points:
        o = PointDir(p.point_dir).read_outcome()
        if o is None:
            return False
        outcomes.append((p.partition, o))
    sched = scheduler_for(m.launcher)
    own = own_job and ({own_job, job_ref(own_cluster, own_job)} if own_cluster else {own_job})
    if sched.keeps_jobs and _jobs_to_run_again(sched, m, own or set()):
        return False  # an outcome whose job Slurm will run again is not final yet
    with parent_lock(sd.path):
        if sd.parent_closed.exists():  # another closer was first
            return False
        _close(m, sd, outcomes, status)
        write_json(sd.parent_closed, {"by": by, "status": status, "time": time.time()})
    return True


def _close(m: Manifest, sd: SweepDir, outcomes: list[tuple[str, dict[str, Any]]], status: str) -> None:
    """Log the summary and the description on the parent run and end it. Never raises for
    MLflow: the marker is still written, the ledger holds what was not sent."""
    counts = summary(outcomes)
    reasons = Counter(o.get("reason", "") for _, o in outcomes if o.get("outcome") == Outcome.FAILED)
    if not m.tracking_uri:  # a sweep without tracking: nothing to close but the marker
        return
    try:
        offline = store.unreachable(m.tracking_uri) is not None  # one bounded probe
        tracker = parent_tracker(m.tracking_uri, m.experiment, m.sweep_id, sd.path, offline)
        tracker.set_tags({K.TAG_NOTE: description(m.sweep_id, counts, reasons)})
        tracker.log_metrics(counts)
        tracker.log_artifact(sd.manifest)
        tracker.close(status)
    except Exception as e:
        log.warning("could not reach MLflow to close the sweep's run: %s", e)


def _jobs_to_run_again(sched: Scheduler, m: Manifest, own_job: set[str]) -> list[str]:
    """The sweep's jobs (but `own_job`) that Slurm will run again: pending, or requeued after
    they wrote an outcome. A job that wrote its outcome and is still tearing down has ended for
    the parent's purpose (its run is closed); waiting for it could leave two ending jobs each
    waiting for the other. When Slurm does not answer, every job: the next closer decides."""
    ids = [p.job_id for p in m.points if p.job_id and p.job_id not in own_job]
    states = sched.job_states(ids, job_name=sweep_job_name(m.sweep_id))
    if states is None:
        return ids
    return [j for j in ids if (js := states.get(j)) is not None and js.state in REQUEUE_STATES]


def closed(sweep_dir: Path) -> dict[str, Any] | None:
    """Who closed the parent run and when, or None while it is open."""
    data = read_json(SweepDir(sweep_dir).parent_closed)
    return dict(data) if isinstance(data, dict) else None
