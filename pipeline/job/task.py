"""The callable submitit pickles on the login node and runs on every rank of the job. Cheap to
import: the job's real work (`pipeline.job.entry`) is imported only when it runs."""

from __future__ import annotations

from typing import Any

from pipeline.contract.spec import JobSpec


class QualifyJob:
    """The callable submitit pickles: `QualifyJob(spec)()` runs on every rank."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    def __call__(self) -> dict[str, Any]:
        from pipeline.job.entry import run_point

        return run_point(self.spec)

    def checkpoint(self) -> Any:
        """Only reached if a signal beats our own handler (it arrives while the job is still
        unpickling): our state is in the last checkpoint, so submitit may simply requeue us."""
        import submitit

        return submitit.helpers.DelayedSubmission(QualifyJob(self.spec))
