"""The attempt's recorder: the one door by which what an attempt learns leaves the job (its
metrics, the resolved config as params, its tags and artifacts, the run's end), in the spirit
of torchtitan's `MetricsProcessor`, and the record of the metrics its outcome carries.

It wraps the point's tracker (pipeline.tracking.ledger.Tracker: every event is appended to the
point's ledger before MLflow sees it, so nothing is lost when MLflow is down). What is common
to every metric is applied here, once:

- rank 0 records: the other ranks (and a run with tracking off) get a NullTracker, but keep
  their own values, since the stages read them on every rank (`Recorder.open`);
- a value that cannot be computed (None) is absent, never 0: it is neither sent nor kept; a
  measured NaN or infinity (a diverged loss) is a value and is sent as it is;
- an attempt's metrics (`log`) are kept for its outcome (the last value of each key), the
  points of a series (`series`: a step's loss, a telemetry sample, one rank's figure) are only
  sent. The trainer gets the recorder as its sink (`log_metrics`, the protocol
  pipeline.train.trainer.MetricsSink): it never sees MLflow.

`tests/unit/test_recorder.py` holds the job to this door: no other module of pipeline/job,
pipeline/drills or pipeline/train reaches a tracker."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.contract.pointdir import PointDir
from pipeline.tracking.ledger import NullTracker, Tracker
from pipeline.tracking.store import resolve_uri

if TYPE_CHECKING:
    from pipeline.config.schema import Config
    from pipeline.contract.spec import JobSpec
    from pipeline.job.distributed import RankEnv


def present(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics that have a value: None (could not be computed) is absent."""
    return {k: v for k, v in metrics.items() if v is not None}


class Recorder:
    """The attempt's tracker, and every metric the attempt logged (its outcome carries them)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.values: dict[str, float] = {}

    @classmethod
    def open(cls, spec: JobSpec, cfg: Config, renv: RankEnv) -> Recorder:
        """The point's recorder on this rank: its MLflow run through the point's ledger on rank 0
        with tracking on; a NullTracker elsewhere."""
        if not renv.is_main or not cfg.tracking.enabled:
            return cls(NullTracker())
        return cls(
            Tracker(
                resolve_uri(spec.tracking_uri),
                cfg.tracking.experiment,
                PointDir(spec.point_dir).tracking,
                run_name=spec.point_id,
                parent_run_id=spec.parent_run_id,
                flush_every_s=cfg.tracking.flush_every_s,
                parent_dir=Path(spec.parent_ledger_dir) if spec.parent_ledger_dir else None,
                redact=cfg.tracking.redact_patterns,
            )
        )

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id, once created (None off rank 0, or while MLflow is down)."""
        return getattr(self.tracker, "run_id", None)

    # --- metrics -----------------------------------------------------------------------------
    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """The attempt's metrics: kept for its outcome, and sent."""
        kept = present(metrics)
        self.values.update(kept)
        self._send(kept, step)

    def series(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Points of a series (a step's loss, a sample at its time, one rank's figure): sent,
        not kept for the outcome."""
        self._send(present(metrics), step)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """The trainer's sink (pipeline.train.trainer.MetricsSink): its per-step series."""
        self.series(metrics, step)

    def _send(self, metrics: dict[str, Any], step: int | None) -> None:
        if metrics:
            self.tracker.log_metrics(metrics, step)

    # --- the rest of the run's record --------------------------------------------------------
    def params(self, params: Mapping[str, Any]) -> None:
        """The resolved config, flattened (pipeline.tracking.ledger.flatten)."""
        self.tracker.log_params(params)

    def tags(self, tags: Mapping[str, Any]) -> None:
        self.tracker.set_tags(tags)

    def artifact(self, path: Path) -> None:
        self.tracker.log_artifact(path)

    def flush(self) -> bool:
        """Everything logged so far into the ledger, then to MLflow; True if MLflow has it all."""
        return bool(self.tracker.flush())

    def close(self, status: str = "FINISHED", terminate: bool = True) -> None:
        """Flush; end the run with `status` unless a later attempt goes on logging into it."""
        self.tracker.close(status, terminate=terminate)
