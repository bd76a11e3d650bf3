"""A sweep: compose and validate every point, write the manifest and the MLflow parent run,
then fan the points out (submitit local, or Slurm arrays grouped by resource shape). Nothing
is submitted unless every point is valid."""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline import keys as K
from pipeline.compose import PROJECT_ROOT, Point, candidate_name, compose_sweep, drill_label
from pipeline.job import JobSpec, QualifyJob
from pipeline.launcher import choose_launcher, group_by_shape, local_executor, slurm_executor
from pipeline.tracking import get_or_create_experiment, resolve_uri
from pipeline.validate import check_points, memory_estimate

MANIFEST = "manifest.json"


def runs_root(runs_dir: str) -> Path:
    p = Path(runs_dir)
    return p if p.is_absolute() else PROJECT_ROOT / p


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


@dataclass
class Plan:
    points: list[Point]
    launcher: str
    why: str
    sweep_dir: Path
    manifest: Manifest


def plan(sweep_name: str, user_overrides: Sequence[str], launcher_kind: str | None = None) -> Plan:
    """Compose + validate every point (raises ConfigError before anything exists on disk)."""
    points = compose_sweep(sweep_name, user_overrides)
    first = points[0].cfg
    if launcher_kind:
        first.launcher.kind = launcher_kind
    if first.launcher.kind == "auto" and not any(p.cfg.partition.slurm_partition for p in points):
        # the embedded default's points (partition=local) run here even where Slurm answers
        launcher, why = "local", "no point names a Slurm partition (partition=local)"
    else:
        launcher, why = choose_launcher(first.launcher)
    if launcher == "slurm":
        from pipeline.slurm import check_against_cluster

        # the config's own checks and the cluster's, all problems in one message
        check_against_cluster([(p.point_id, p.cfg) for p in points])
    else:
        check_points([(p.point_id, p.cfg) for p in points])
        local_problems = [
            f"  {p.point_id}: parallelism.nodes={p.cfg.parallelism.nodes} needs Slurm"
            for p in points
            if p.cfg.parallelism.nodes > 1
        ]
        if local_problems:
            from pipeline.config import ConfigError

            raise ConfigError(
                "Multi-node points need Slurm; nothing was submitted:\n" + "\n".join(local_problems)
            )
    sweep_id = new_sweep_id()
    sweep_dir = runs_root(first.runs_dir) / sweep_id
    manifest = Manifest(
        sweep_id=sweep_id,
        sweep=sweep_name,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        launcher=launcher,
        tracking_uri=resolve_uri(first.tracking.uri),
        experiment=first.tracking.experiment,
        user_overrides=list(user_overrides),
    )
    for p in points:
        manifest.points.append(
            PointEntry(
                point_id=p.point_id,
                index=p.index,
                overrides=p.overrides,
                candidate=candidate_name(p.cfg),
                partition=p.cfg.partition.name,
                drills=drill_label(p.cfg),
                point_dir=str(sweep_dir / "points" / p.point_id),
                mem_verdict=memory_estimate(p.cfg).verdict,
            )
        )
    return Plan(points, launcher, why, sweep_dir, manifest)


def create_parent_run(manifest: Manifest, manifest_path: Path) -> str:
    """The sweep's MLflow parent run, created once before the fan-out (never by racing jobs)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=manifest.tracking_uri)
    exp_id = get_or_create_experiment(client, manifest.experiment)
    run = client.create_run(
        exp_id,
        run_name=f"sweep-{manifest.sweep_id}",
        tags={
            K.TAG_PARENT_KIND: "sweep",
            K.TAG_SWEEP_ID: manifest.sweep_id,
            K.TAG_LAUNCHER: manifest.launcher,
            "sq.sweep": manifest.sweep,
            "sq.points": str(len(manifest.points)),
            "sq.overrides": " ".join(manifest.user_overrides),
        },
    )
    return str(run.info.run_id)


def log_manifest(manifest: Manifest, manifest_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    if manifest.parent_run_id:
        MlflowClient(tracking_uri=manifest.tracking_uri).log_artifact(
            manifest.parent_run_id, str(manifest_path)
        )


def write_point_files(pl: Plan) -> None:
    for p, entry in zip(pl.points, pl.manifest.points, strict=True):
        d = Path(entry.point_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / K.ARTIFACT_CONFIG).write_text(p.yaml)
        (d / "overrides.json").write_text(json.dumps(p.overrides))


def spec_for(pl: Plan, p: Point, entry: PointEntry) -> JobSpec:
    m = pl.manifest
    return JobSpec(
        sweep_id=m.sweep_id,
        point_id=entry.point_id,
        config_yaml=p.yaml,
        point_dir=entry.point_dir,
        parent_run_id=m.parent_run_id,
        tracking_uri=m.tracking_uri,
        launcher=pl.launcher,
        overrides=p.overrides,
    )


def submit(pl: Plan, on_result: Any = None) -> Manifest:
    """Write manifest + parent run, then submit. Local points run one after another (each
    already uses several ranks) and are waited for; Slurm returns once all is queued."""
    pl.sweep_dir.mkdir(parents=True, exist_ok=True)
    write_point_files(pl)
    m = pl.manifest
    path = m.write(pl.sweep_dir)
    m.parent_run_id = create_parent_run(m, path)
    path = m.write(pl.sweep_dir)
    log_manifest(m, path)
    folder = pl.sweep_dir / "submitit"
    if pl.launcher == "slurm":
        _submit_slurm(pl, folder)
        m.submitted = True
        log_manifest(m, m.write(pl.sweep_dir))
        return m
    m.submitted = True
    m.write(pl.sweep_dir)
    for p, entry in zip(pl.points, m.points, strict=True):
        executor = local_executor(folder, p.cfg)
        job = executor.submit(QualifyJob(spec_for(pl, p, entry)))
        entry.job_id = str(job.job_id)
        entry.group = "local"
        m.write(pl.sweep_dir)
        result = _result_or_failure(job, entry, m)
        if on_result is not None:
            on_result(entry, result)
    finish_parent_run(m)
    log_manifest(m, m.write(pl.sweep_dir))
    return m


def _result_or_failure(job: Any, entry: PointEntry, m: Manifest) -> dict[str, Any]:
    try:
        return dict(job.results()[0])  # rank 0 speaks for the run
    except Exception as e:  # the job died before it could record its outcome
        from pipeline.status import record_lost_point

        detail = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
        return record_lost_point(
            entry, detail, m.tracking_uri, m.parent_run_id, experiment=m.experiment, sweep_id=m.sweep_id
        )


def slurm_job_name(sweep_id: str) -> str:
    """Every job of a sweep has this name (status matches on it: job ids are reused)."""
    return f"sq-{sweep_id}"


class SubmissionError(RuntimeError):
    """sbatch refused a group; the groups already queued were cancelled."""


def _submit_slurm(pl: Plan, folder: Path) -> None:
    """One submitit job array per resource shape (one sbatch call each). If sbatch refuses a
    group, the groups already queued are cancelled: a sweep is submitted whole or not at all."""
    m = pl.manifest
    groups = group_by_shape([(i, p.cfg) for i, p in enumerate(pl.points)])
    for shape, indices in groups.items():
        executor = slurm_executor(
            folder, shape, pl.points[indices[0]].cfg.launcher, slurm_job_name(m.sweep_id)
        )
        jobs = []
        try:
            with executor.batch():
                for i in indices:
                    jobs.append(executor.submit(QualifyJob(spec_for(pl, pl.points[i], m.points[i]))))
        except Exception as e:
            from pipeline.slurm import cancel

            queued = [p.job_id for p in m.points if p.job_id]
            cancel(queued)
            for p in m.points:
                p.job_id = ""
            detail = str(e).strip().splitlines()[-1][:500] if str(e).strip() else type(e).__name__
            m.error = (
                f"sbatch refused group {shape.label()}: {detail}. "
                f"Cancelled the {len(queued)} job(s) already queued; nothing of sweep {m.sweep_id} runs."
            )
            m.write(pl.sweep_dir)
            finish_parent_run(m, status="FAILED")
            raise SubmissionError(m.error) from e
        for i, job in zip(indices, jobs, strict=True):
            m.points[i].job_id = str(job.job_id)
            m.points[i].group = shape.label()


def finish_parent_run(m: Manifest, status: str = "FINISHED") -> None:
    from mlflow.tracking import MlflowClient

    if m.parent_run_id:
        client = MlflowClient(tracking_uri=m.tracking_uri)
        client.set_terminated(m.parent_run_id, status=status, end_time=int(time.time() * 1000))
