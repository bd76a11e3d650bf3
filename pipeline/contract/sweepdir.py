"""The sweep folder, `runs/<sweep id>/`: every path in it, and its manifest. The only code that
knows the layout (like submitit's `JobPaths`); a point's own folder is `PointDir`'s. Torch-free:
the sweep writes here (login node), `status` reads here, the job closes the parent run from here.

    manifest.json        every point, its folder, its job id (`Manifest`)
    tracking/            the MLflow ledger of the sweep's parent run
    points/<point id>/   one point's folder (`pipeline.contract.pointdir.PointDir`)
    submitit/            the executor's scripts and logs
    report/              `make report`'s decision record
    launch/<candidate>/  `qualify launch`'s production job: job.sbatch, ds_config.json, train.yaml,
                         WHY.md, spec.json, launch.json; its run's folder run/ (or smoke/), logs/
    adaptive/            sweep.adaptive on Slurm: state.json, round-<k>.json markers, ended.json,
                         stopped.json, the controllers' logs, .lock (held by a controller as it submits)
    .parent.lock         held by whoever writes into the parent run's ledger
    .parent_closed       who closed the parent run, and when (JSON)
    .status.lock         held by a `status` poll that asks Slurm
    .status_cache.json   the last Slurm answer, shared by the sweep's watchers

Every file is written with `pipeline.files.write_atomic` (atomic and durable).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.contract.pointdir import PointDir
from pipeline.files import write_json


@dataclass
class PointEntry:
    point_id: str
    index: int
    overrides: list[str]
    candidate: str
    partition: str
    drills: str
    point_dir: str
    mem_verdict: str
    group: str = ""
    job_id: str = ""
    """Its job as the sweep addresses it: Slurm's id, or `<cluster>:<id>` when `slurm_cluster`
    is set (pipeline.slurm.job.job_ref: ids are each cluster's own), which every scheduler call
    addresses on that cluster."""
    slurm_cluster: str = ""
    """The Slurm cluster its job runs on, in a sweep whose points span several clusters of one
    slurmdbd (partition.slurm_cluster; every point of such a sweep names its cluster, the login
    node's included, and is submitted and asked about with --clusters/-M); "" in a sweep on
    the login node's cluster alone, and for the local launcher."""


@dataclass
class Manifest:
    sweep_id: str
    sweep: str
    created: str
    launcher: str
    tracking_uri: str
    experiment: str
    user_overrides: list[str]
    parent_run_id: str | None = None
    points: list[PointEntry] = field(default_factory=list)
    submitted: bool = False
    error: str = ""  # why submission failed (then nothing of the sweep runs)
    submit_pid: int = 0  # the local sweep's process: its points wait for it while it lives
    submit_host: str = ""
    cluster: dict[str, str] = field(default_factory=dict)
    """The cluster its points run on: {name, controller, slurm_version} (pipeline.sched's
    ClusterIdentity, read when the sweep was planned); empty in manifests written before. The
    login node's own cluster; a point on another cluster has that cluster's in `clusters`."""
    clusters: dict[str, dict[str, str]] = field(default_factory=dict)
    """Every other cluster the sweep's points run on (`-M`), by name: its identity as above,
    read with `scontrol -M <name> show config` when the sweep was planned."""

    def write(self, sweep_dir: Path) -> Path:
        path = SweepDir(sweep_dir).manifest
        write_json(path, asdict(self))
        return path

    @classmethod
    def read(cls, sweep_dir: Path) -> Manifest:
        data = json.loads(SweepDir(sweep_dir).manifest.read_text())
        data["points"] = [PointEntry(**p) for p in data["points"]]
        return cls(**data)


class SweepDir:
    """One sweep's folder. Paths are properties."""

    MANIFEST = "manifest.json"
    PARENT_LEDGER = "tracking"
    POINTS = "points"
    SUBMITIT = "submitit"
    REPORT = "report"
    PARENT_LOCK = ".parent.lock"
    PARENT_CLOSED = ".parent_closed"
    STATUS_LOCK = ".status.lock"
    STATUS_CACHE = ".status_cache.json"
    ADAPTIVE = "adaptive"
    LAUNCH = "launch"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"SweepDir({str(self.path)!r})"

    @classmethod
    def of_point(cls, point: PointDir) -> SweepDir:
        """The sweep folder a point's folder lies in (`points/<point id>/`)."""
        return cls(point.path.parent.parent)

    @property
    def manifest(self) -> Path:
        return self.path / self.MANIFEST

    @property
    def parent_ledger(self) -> Path:
        return self.path / self.PARENT_LEDGER

    def point(self, point_id: str) -> PointDir:
        return PointDir(self.path / self.POINTS / point_id)

    @property
    def submitit(self) -> Path:
        return self.path / self.SUBMITIT

    @property
    def report(self) -> Path:
        return self.path / self.REPORT

    def launch(self, folder: str) -> Path:
        """`qualify launch`'s folder of one candidate (its name made a folder name)."""
        return self.path / self.LAUNCH / folder

    @property
    def parent_lock(self) -> Path:
        return self.path / self.PARENT_LOCK

    @property
    def parent_closed(self) -> Path:
        return self.path / self.PARENT_CLOSED

    @property
    def status_lock(self) -> Path:
        return self.path / self.STATUS_LOCK

    @property
    def status_cache(self) -> Path:
        return self.path / self.STATUS_CACHE

    @property
    def adaptive(self) -> Path:
        return self.path / self.ADAPTIVE

    @property
    def adaptive_state(self) -> Path:
        return self.adaptive / "state.json"

    def round_marker(self, k: int) -> Path:
        return self.adaptive / f"round-{k}.json"

    def round_markers(self) -> list[Path]:
        """Every round's marker, in round order."""
        found = self.adaptive.glob("round-*.json") if self.adaptive.is_dir() else []
        return sorted(found, key=lambda p: int(p.stem.partition("-")[2] or 0))

    @property
    def adaptive_ended(self) -> Path:
        return self.adaptive / "ended.json"

    @property
    def adaptive_stopped(self) -> Path:
        return self.adaptive / "stopped.json"

    @property
    def adaptive_lock(self) -> Path:
        return self.adaptive / ".lock"

    def controller_paused(self, step: str) -> Path:
        """Where a controller paused at `step` of a submission says so (SQ_CONTROLLER_PAUSE)."""
        return self.adaptive / f"paused-{step}.json"

    def controller_log(self, k: int) -> Path:
        """The controller of round k's output (`%j`: its job id, filled by Slurm)."""
        return self.adaptive / f"controller-r{k}-%j.out"
