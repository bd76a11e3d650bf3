"""The final bill of Slurm points, on the login node: once a point's job has ended, its time
and cost are recomputed from `sacct`'s final figures for every allocation (requeues included)
and logged into its run (tag sq.allocated_source=sacct_final). The job itself can only read
its current allocation up to its own exit; Slurm's teardown after that (srun, the batch script,
the epilog) is billed too. Torch-free."""

from __future__ import annotations

import logging

from pipeline.config.resolved import config_from_yaml
from pipeline.contract.accounting import run_totals
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptRecord
from pipeline.contract.retention import kept_checkpoint_bytes
from pipeline.files import write_json
from pipeline.sched import JobState, scheduler_for, sweep_job_name
from pipeline.submit.manifest import Manifest, PointEntry
from pipeline.tracking import keys as K
from pipeline.tracking import store
from pipeline.tracking.ledger import LedgerDir

log = logging.getLogger(__name__)

BILLED = PointDir.BILLED  # the file name, for callers that only know the folder

ENDED = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
)


def bill_ended_points(m: Manifest, states: dict[str, JobState]) -> int:
    """Bill every point whose job has ended and that is not billed yet; the number of points
    still waiting for their job to end (their bill comes on a later call)."""
    waiting = 0
    for entry in m.points:
        point = PointDir(entry.point_dir)
        if not entry.job_id or point.billed.exists() or point.read_outcome() is None:
            continue
        js = states.get(entry.job_id)
        if js is None or js.live or js.state not in ENDED:
            waiting += 1
            continue
        try:
            _bill(m, entry, point)
        except Exception as e:  # a bill that cannot be made leaves the job's own figures
            log.warning("could not bill %s from sacct: %s", entry.point_id, e)
            write_json(point.billed, {"error": str(e)})
    return waiting


def _bill(m: Manifest, entry: PointEntry, point: PointDir) -> None:
    attempts = AttemptRecord.read_all(point.attempts())
    allocations = scheduler_for(m.launcher).allocations(entry.job_id or "", sweep_job_name(m.sweep_id))
    if not attempts or allocations is None:
        write_json(point.billed, {"error": "no attempt records or no sacct record"})
        return
    cfg = config_from_yaml(point.config.read_text())
    totals, _ = run_totals(cfg, attempts, kept_checkpoint_bytes(point.checkpoints), allocations)
    run_id = LedgerDir(point.tracking).read_run_id()
    if m.tracking_uri and run_id:
        store.log_metrics_and_tags(
            m.tracking_uri,
            run_id,
            totals,
            {K.TAG_ALLOCATED_SOURCE: K.ALLOCATED_SACCT_FINAL},
        )
    write_json(point.billed, {"source": K.ALLOCATED_SACCT_FINAL, **totals})
