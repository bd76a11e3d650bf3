"""drill=timeout: a time limit shorter than the run (the job's own limit, set at submission);
the warning signal before it makes every rank save, the job is requeued and resumes. No step
hook: the scheduler (or the local executor) sends the signal."""

from __future__ import annotations

from pipeline.contract.records import StopReason
from pipeline.job.drills.base import Drill

DRILL = Drill(
    name="timeout",
    summary="a time limit shorter than the run: save on the warning signal, requeue, resume",
    stops=(StopReason.TIMEOUT,),
    stopped_by="the time-limit warning",
    reference=True,
)
