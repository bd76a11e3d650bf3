"""The point folder, `runs/<sweep>/points/<point>/`: every file name in it, and the only code
that reads or writes its JSON records. Torch-free: the job writes here, `status` (login node)
reads here.

    config.yaml        the resolved config (written by the sweep, logged by the job)
    overrides.json     the point's overrides
    ds_config.json     the derived DeepSpeed config
    outcome.json       how the point ended (written once, by the job's rank 0 or by status
                       for a job that died without one)
    attempts.json      one record per attempt (allocation), appended by rank 0 at its end
    restart.json       how the last attempt stopped: the next one measures its restart from it
    drill_kill.json    which rank the kill_worker drill killed, and when
    progress.json      what the running attempt's rank 0 is doing: phase, step k of n, pace
                       (pipeline.job.progress; at most one write a second)
    billed.json        the final bill from sacct, written by the login node once the job ended
    traceback.txt      the exception that ended the point, when one did (also an MLflow artifact)
    tracking/          the MLflow ledger (`pipeline.tracking.ledger`)
    checkpoints/       the run's checkpoints (`pipeline.train.checkpoint`)
    reference/         the drills' uninterrupted reference run's checkpoints
    universal/         the reshape drill's universal checkpoint; reshape/ its resumed ranks

Every file is replaced atomically and durably (`pipeline.files.write_atomic`: unique temporary
file, fsync, rename, fsync of the folder), so a reader never sees half a file and two writers
never share a temporary file. The sweep folder around it is `pipeline.contract.sweepdir`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.files import read_json as read_json
from pipeline.files import write_atomic
from pipeline.files import write_json as write_json
from pipeline.tracking import keys as K


class PointDir:
    """One point's folder. Paths are properties; records go through the methods."""

    OUTCOME = "outcome.json"
    ATTEMPTS = "attempts.json"
    STOP = "restart.json"
    KILL = "drill_kill.json"
    PROGRESS = "progress.json"
    OVERRIDES = "overrides.json"
    BILLED = "billed.json"
    CONFIG = K.ARTIFACT_CONFIG
    DS_CONFIG = K.ARTIFACT_DS_CONFIG

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"PointDir({str(self.path)!r})"

    def create(self) -> PointDir:
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    # --- folders ---------------------------------------------------------------------------
    @property
    def tracking(self) -> Path:
        return self.path / "tracking"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def reference(self) -> Path:
        return self.path / "reference"

    @property
    def universal(self) -> Path:
        return self.path / "universal"

    @property
    def reshape(self) -> Path:
        return self.path / "reshape"

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def search(self) -> Path:
        """The micro-batch search's trials and result (pipeline/job/search.py)."""
        return self.path / "search.json"

    @property
    def probes(self) -> Path:
        """The node probes' figures (matmul ceiling, collective bandwidth) and where they were
        measured: a restart on the same nodes reuses them (pipeline/job/runner.py)."""
        return self.path / "probes.json"

    @property
    def ds_config(self) -> Path:
        return self.path / self.DS_CONFIG

    @property
    def billed(self) -> Path:
        """The final bill from sacct, once the point's job ended (pipeline/submit/billing.py)."""
        return self.path / self.BILLED

    @property
    def traceback(self) -> Path:
        """The traceback of the exception that ended the point (written by its rank 0)."""
        return self.path / "traceback.txt"

    # --- records ---------------------------------------------------------------------------
    def write_inputs(self, config_yaml: str, overrides: list[str]) -> None:
        """What the sweep leaves for the job: the resolved config and the overrides."""
        self.create()
        write_atomic(self.config, config_yaml)
        write_json(self.path / self.OVERRIDES, overrides)

    def read_outcome(self) -> dict[str, Any] | None:
        data = read_json(self.path / self.OUTCOME)
        return dict(data) if isinstance(data, dict) else None

    def write_outcome(self, summary: dict[str, Any]) -> None:
        self.create()
        write_json(self.path / self.OUTCOME, summary)

    def clear_outcome(self) -> None:
        """The point runs again (submitted anew by the login node): its last outcome is not final."""
        (self.path / self.OUTCOME).unlink(missing_ok=True)

    def attempts(self) -> list[dict[str, Any]]:
        """The records of the attempts that ended, oldest first."""
        data = read_json(self.path / self.ATTEMPTS)
        return list(data) if isinstance(data, list) else []

    def mark_resubmitted(self) -> None:
        """`qualify resume` runs the point again: its last attempt's record says so (the next
        attempt is a new job, not Slurm's requeue of this one)."""
        attempts = self.attempts()
        if attempts:
            write_json(self.path / self.ATTEMPTS, [*attempts[:-1], {**attempts[-1], "resubmitted": True}])

    def append_attempt(self, record: dict[str, Any]) -> None:
        """Add one attempt's record. Called once per attempt, by one process (rank 0)."""
        write_json(self.path / self.ATTEMPTS, [*self.attempts(), record])

    def read_search(self) -> dict[str, Any] | None:
        return read_json(self.search)  # type: ignore[no-any-return]

    def write_search(self, result: dict[str, Any]) -> None:
        write_json(self.search, result)

    def read_probes(self) -> dict[str, Any] | None:
        data = read_json(self.probes)
        return dict(data) if isinstance(data, dict) else None

    def write_probes(self, record: dict[str, Any]) -> None:
        write_json(self.probes, record)

    def read_stop(self) -> dict[str, Any] | None:
        data = read_json(self.path / self.STOP)
        return dict(data) if isinstance(data, dict) else None

    def write_stop(self, record: dict[str, Any]) -> None:
        write_json(self.path / self.STOP, record)

    def clear_stop(self) -> None:
        (self.path / self.STOP).unlink(missing_ok=True)

    def read_kill(self) -> dict[str, Any] | None:
        data = read_json(self.path / self.KILL)
        return dict(data) if isinstance(data, dict) else None

    def write_kill(self, record: dict[str, Any]) -> None:
        write_json(self.path / self.KILL, record)

    def read_progress(self) -> dict[str, Any] | None:
        data = read_json(self.path / self.PROGRESS)
        return dict(data) if isinstance(data, dict) else None

    def write_progress(self, record: dict[str, Any]) -> None:
        write_json(self.path / self.PROGRESS, record)
