"""Where sweeps are (`runs/`), a new sweep's id, and the life of the sweep's MLflow parent run.
The sweep folder's layout and its manifest's type are `pipeline.contract.sweepdir`'s (re-exported
here for the login node's callers); torch-free."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from pathlib import Path

from pipeline.contract.parent import parent_tracker as _parent_tracker
from pipeline.contract.sweepdir import Manifest as Manifest
from pipeline.contract.sweepdir import PointEntry as PointEntry
from pipeline.contract.sweepdir import SweepDir
from pipeline.home import project_home
from pipeline.tracking import keys as K
from pipeline.tracking.ledger import Tracker

MANIFEST = SweepDir.MANIFEST
PARENT_LEDGER = SweepDir.PARENT_LEDGER


def runs_root(runs_dir: str) -> Path:
    p = Path(runs_dir)
    return p if p.is_absolute() else project_home() / p


def new_sweep_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def latest_sweep_dir(runs: Path) -> Path:
    sweeps = sorted(p for p in runs.glob("*/" + MANIFEST)) if runs.is_dir() else []
    if not sweeps:
        raise FileNotFoundError(f"no sweep under {runs}: run `make sweep` first")
    return sweeps[-1].parent


def sweep_dir_for(runs: Path, sweep_id: str | None) -> Path:
    if not sweep_id:
        return latest_sweep_dir(runs)
    path = runs / sweep_id
    if not SweepDir(path).manifest.exists():
        raise FileNotFoundError(f"no sweep '{sweep_id}' under {runs}")
    return path


def parent_tracker(m: Manifest, sweep_dir: Path, offline: bool = False) -> Tracker:
    """The sweep's parent run, through a ledger like every job's run: created when MLflow
    answers, replayed by `qualify sync` when it does not. The run id, once known, is in
    `<ledger>/mlflow_run_id` (jobs started before it existed link to it from there)."""
    return _parent_tracker(m.tracking_uri, m.experiment, m.sweep_id, sweep_dir, offline)


def create_parent_run(m: Manifest, sweep_dir: Path, offline: bool = False) -> Tracker:
    """The parent run, created once before the fan-out (never by racing jobs); its id goes
    into the manifest when MLflow answered."""
    tracker = parent_tracker(m, sweep_dir, offline)
    tracker.set_tags(
        {
            K.TAG_PARENT_KIND: "sweep",
            K.TAG_SWEEP_ID: m.sweep_id,
            K.TAG_LAUNCHER: m.launcher,
            K.TAG_SWEEP: m.sweep,
            K.TAG_POINTS: str(len(m.points)),
            K.TAG_OVERRIDES: " ".join(m.user_overrides),
            **K.cluster_tags(m.cluster),
        }
    )
    tracker.flush()
    m.parent_run_id = tracker.run_id
    return tracker


def log_manifest(m: Manifest, manifest_path: Path, tracker: Tracker) -> None:
    """The manifest as an artifact of the parent run (sent now, or kept in the ledger)."""
    tracker.log_artifact(manifest_path)
    tracker.flush()
    m.parent_run_id = m.parent_run_id or tracker.run_id


def finish_parent_run(m: Manifest, tracker: Tracker, status: str = "FINISHED") -> None:
    """End the parent run (now, or when the ledger is replayed); closes the tracker."""
    tracker.close(status)
    m.parent_run_id = m.parent_run_id or tracker.run_id


def parent_status(sweep_dir: Path) -> str | None:
    """The status the parent run ends with: FAILED when submission failed, FINISHED once every
    point has an outcome, None while some still run."""
    from pipeline.contract.pointdir import PointDir

    m = Manifest.read(sweep_dir)
    if m.error:
        return "FAILED"
    done = all(PointDir(p.point_dir).read_outcome() is not None for p in m.points)
    return "FINISHED" if done and m.submitted else None
