"""A sweep's folder and manifest (`runs/<sweep id>/manifest.json`: every point, its folder,
its job id), and the life of the sweep's MLflow parent run. Read by `status` and `report`,
written by `sweep`; torch-free."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pipeline.home import project_home
from pipeline.tracking import keys as K
from pipeline.tracking import store

MANIFEST = "manifest.json"


def runs_root(runs_dir: str) -> Path:
    p = Path(runs_dir)
    return p if p.is_absolute() else project_home() / p


def new_sweep_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


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

    def write(self, sweep_dir: Path) -> Path:
        path = sweep_dir / MANIFEST
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, sweep_dir: Path) -> Manifest:
        data = json.loads((sweep_dir / MANIFEST).read_text())
        data["points"] = [PointEntry(**p) for p in data["points"]]
        return cls(**data)


def latest_sweep_dir(runs: Path) -> Path:
    sweeps = sorted(p for p in runs.glob("*/" + MANIFEST)) if runs.is_dir() else []
    if not sweeps:
        raise FileNotFoundError(f"no sweep under {runs}: run `make sweep` first")
    return sweeps[-1].parent


def sweep_dir_for(runs: Path, sweep_id: str | None) -> Path:
    if not sweep_id:
        return latest_sweep_dir(runs)
    path = runs / sweep_id
    if not (path / MANIFEST).exists():
        raise FileNotFoundError(f"no sweep '{sweep_id}' under {runs}")
    return path


def slurm_job_name(sweep_id: str) -> str:
    """Every job of a sweep has this name (status matches on it: job ids are reused)."""
    return f"sq-{sweep_id}"


def create_parent_run(manifest: Manifest, manifest_path: Path) -> str:
    """The sweep's MLflow parent run, created once before the fan-out (never by racing jobs)."""
    return store.create_run(
        manifest.tracking_uri,
        manifest.experiment,
        f"sweep-{manifest.sweep_id}",
        tags={
            K.TAG_PARENT_KIND: "sweep",
            K.TAG_SWEEP_ID: manifest.sweep_id,
            K.TAG_LAUNCHER: manifest.launcher,
            "sq.sweep": manifest.sweep,
            "sq.points": str(len(manifest.points)),
            "sq.overrides": " ".join(manifest.user_overrides),
        },
    )


def log_manifest(manifest: Manifest, manifest_path: Path) -> None:
    if manifest.parent_run_id:
        store.log_artifact(manifest.tracking_uri, manifest.parent_run_id, manifest_path)


def finish_parent_run(m: Manifest, status: str = "FINISHED") -> None:
    if m.parent_run_id:
        store.end_run(m.tracking_uri, m.parent_run_id, status)
