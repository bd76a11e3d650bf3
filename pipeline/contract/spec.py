"""The contract between the login node and a job: what the sweep hands each job (`JobSpec`)
and what a job ends with (`PointEnd`). Torch-free and cheap to import."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class JobSpec:
    """What the sweep hands each job (picklable, no Hydra objects)."""

    sweep_id: str
    point_id: str
    config_yaml: str
    point_dir: str
    parent_run_id: str | None
    tracking_uri: str
    launcher: str  # local | slurm
    overrides: list[str] = field(default_factory=list)
    parent_ledger_dir: str | None = None  # the parent run's ledger: where its id appears if MLflow was down
    # the manifest's cluster (pipeline.slurm.cluster.ClusterIdentity): the run's sq.cluster* tags
    cluster: dict[str, str] = field(default_factory=dict)
    kind: str = "point"  # tag sq.kind: a sweep's point, or `production` (qualify launch's job)


@dataclass
class PointEnd:
    """How a point ended: accepted, or failed with a reason (`pipeline.tracking.keys` REASON_*)."""

    outcome: str
    reason: str = ""
    detail: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """Sentences the login node prints with the outcome (a resume that skipped checkpoints)."""
