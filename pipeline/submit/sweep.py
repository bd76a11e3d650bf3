"""A sweep: compose and validate every point, write the manifest and the MLflow parent run,
then fan the points out (submitit local, or Slurm arrays grouped by resource shape). Nothing
is submitted unless every point is valid."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.config.compose import Point, compose_sweep
from pipeline.config.resolved import candidate_name, drill_label
from pipeline.config.validate import check_points, memory_estimate
from pipeline.job.parent import close_if_done, parent_lock
from pipeline.job.pointdir import PointDir
from pipeline.job.spec import JobSpec
from pipeline.job.task import QualifyJob
from pipeline.slurm.job import sweep_job_name
from pipeline.submit.launcher import (
    ResourceShape,
    choose_launcher,
    group_by_shape,
    local_executor,
    slurm_executor,
)
from pipeline.submit.manifest import (
    PARENT_LEDGER,
    Manifest,
    PointEntry,
    create_parent_run,
    finish_parent_run,
    log_manifest,
    new_sweep_id,
    parent_tracker,
    runs_root,
)
from pipeline.tracking import keys as K
from pipeline.tracking import store
from pipeline.tracking.ledger import Tracker
from pipeline.tracking.redact import REDACTED, adopt_credentials, is_secret_key, redact_tree, strip_userinfo


@dataclass
class Plan:
    points: list[Point]
    launcher: str
    why: str
    sweep_dir: Path
    manifest: Manifest


def plan(sweep_name: str, user_overrides: Sequence[str], launcher_kind: str | None = None) -> Plan:
    """Compose + validate every point (raises ConfigError before anything exists on disk)."""
    points = [without_secrets(p) for p in compose_sweep(sweep_name, user_overrides)]
    first = points[0].cfg
    if launcher_kind:
        first.launcher.kind = launcher_kind
    if first.launcher.kind == "auto" and not any(p.cfg.partition.slurm_partition for p in points):
        # the embedded default's points (partition=local) run here even where Slurm answers
        launcher, why = "local", "no point names a Slurm partition (partition=local)"
    else:
        launcher, why = choose_launcher(first.launcher)
    if launcher == "slurm":
        from pipeline.submit.checks import check_against_cluster

        for shape in group_by_shape([(i, p.cfg) for i, p in enumerate(points)]):
            shape.check()  # nothing reaches sbatch or a Slurm command that could add lines to it
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
            from pipeline.config.schema import ConfigError

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
        tracking_uri=adopt_credentials(store.resolve_uri(first.tracking.uri)),
        experiment=first.tracking.experiment,
        user_overrides=redact_overrides(user_overrides, first.tracking.redact_patterns),
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


def redact_overrides(overrides: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """Overrides as they may be written or logged: user-info stripped, secret keys' values ***."""
    out = []
    for o in overrides:
        key, sep, _ = o.partition("=")
        out.append(
            f"{key}={REDACTED}" if sep and is_secret_key(key.lstrip("+~"), patterns) else strip_userinfo(o)
        )
    return out


def without_secrets(p: Point) -> Point:
    """The point as the sweep writes it and hands it to its job: a tracking URI's user-info
    moved to the environment MLflow reads (jobs inherit it; nothing on disk holds it), and
    secret values redacted from the resolved config and the overrides."""
    import yaml

    patterns = p.cfg.tracking.redact_patterns
    if p.cfg.tracking.uri:
        p.cfg.tracking.uri = adopt_credentials(p.cfg.tracking.uri)
    # libyaml both ways when it is there (the pure-Python parser was 3/4 of planning time)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    tree = p.tree if p.tree is not None else yaml.load(p.yaml, Loader=loader)  # noqa: S506 (a safe loader)
    clean = redact_tree(tree, patterns)
    if clean != tree:
        p.yaml = str(yaml.dump(clean, Dumper=dumper, sort_keys=False))
    p.tree = None  # what was composed is not kept past this point
    p.overrides = redact_overrides(p.overrides, patterns)
    return p


def write_point_files(pl: Plan) -> None:
    for p, entry in zip(pl.points, pl.manifest.points, strict=True):
        PointDir(entry.point_dir).write_inputs(p.yaml, p.overrides)


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
        parent_ledger_dir=str(pl.sweep_dir / PARENT_LEDGER),
    )


def submit(pl: Plan, on_result: Any = None, on_progress: Any = None) -> Manifest:
    """Write manifest + parent run, then submit. Local points run one after another (each
    already uses several ranks) and are waited for; Slurm returns once all is queued.
    MLflow is never waited for: the parent run goes through a ledger like every job's run,
    and when the tracking store does not answer the probe, one line says so and the sweep
    goes on (`qualify sync` sends the ledgers later). `on_progress(line)`: while a local point
    runs, its phase, step and the sweep's time left, when they change (`follow_point`)."""
    store.bound_http_requests()
    m = pl.manifest
    problem = store.unreachable(m.tracking_uri)
    if problem:
        print(
            f"[tracking] MLflow unreachable: {problem}. The sweep goes on; every run is kept in its "
            f"ledger under {pl.sweep_dir}. Replay them once it answers: make sync SWEEP={m.sweep_id}",
            flush=True,
        )
    pl.sweep_dir.mkdir(parents=True, exist_ok=True)
    write_point_files(pl)
    m.write(pl.sweep_dir)
    parent = create_parent_run(m, pl.sweep_dir, offline=problem is not None)
    log_manifest(m, m.write(pl.sweep_dir), parent)
    folder = pl.sweep_dir / "submitit"
    if pl.launcher == "slurm":
        _submit_slurm(pl, folder, parent)  # on SubmissionError the parent run ended FAILED
        m.submitted = True
        log_manifest(m, m.write(pl.sweep_dir), parent)
        parent.close(terminate=False)  # `status` ends it once every point has its outcome
        return m
    m.submitted = True
    m.submit_pid, m.submit_host = os.getpid(), socket.gethostname()
    log_manifest(m, m.write(pl.sweep_dir), parent)
    parent.close(terminate=False)  # closed by the last point to end (or by this, below)
    job: Any = None
    try:
        for p, entry in zip(pl.points, m.points, strict=True):
            executor = local_executor(folder, p.cfg)
            job = executor.submit(QualifyJob(spec_for(pl, p, entry)))
            entry.job_id = str(job.job_id)
            entry.group = "local"
            m.write(pl.sweep_dir)
            if on_progress is not None:
                follow_point(job, entry, m, on_progress)
            result = _result_or_failure(job, entry, m)
            if on_result is not None:
                on_result(entry, result)
            if m.parent_run_id is None and not parent.offline:
                with parent_lock(pl.sweep_dir):  # MLflow is back: the parent exists now
                    again = parent_tracker(m, pl.sweep_dir)
                    again.close(terminate=False)
                m.parent_run_id = again.run_id
    except KeyboardInterrupt:
        _interrupted(pl, job)
        raise
    with parent_lock(pl.sweep_dir):
        log_manifest(m, m.write(pl.sweep_dir), parent_tracker(m, pl.sweep_dir, offline=parent.offline))
    close_if_done(pl.sweep_dir, by=f"sweep pid {os.getpid()}")
    return m


def _interrupted(pl: Plan, job: Any) -> None:
    """Ctrl-C on a local sweep: its running point is stopped, and every point without an
    outcome ends failed (`interrupted`), its MLflow run KILLED; then the parent run, KILLED."""
    from pipeline.submit.status import read_outcome, record_interrupted

    m = pl.manifest
    if job is not None:
        with contextlib.suppress(Exception):
            job.cancel(check=False)
            deadline = time.monotonic() + 30  # its ranks save nothing: they only need to exit
            while not job.done() and time.monotonic() < deadline:
                time.sleep(0.5)
    for entry in m.points:
        if read_outcome(entry) is None:
            record_interrupted(entry, m)
    m.write(pl.sweep_dir)
    close_if_done(pl.sweep_dir, by=f"sweep pid {os.getpid()} (interrupted)", status="KILLED")


PROGRESS_EVERY_S = 10.0  # a local sweep prints a running point's step at most this often


def follow_point(job: Any, entry: PointEntry, m: Manifest, say: Any, poll_s: float = 1.0) -> None:
    """Until the local point's job ends: `say` its phase (pipeline/job/progress.py) each time
    it changes, and its step with the sweep's time left every PROGRESS_EVERY_S of training."""
    from pipeline.submit.status import phase_text, point_states, sweep_eta

    last, last_at = ("", ""), 0.0
    while not job.done():
        progress = PointDir(entry.point_dir).read_progress() or {}
        now = time.time()
        key = (progress.get("phase", ""), progress.get("detail", ""))
        if key != last or now - last_at >= PROGRESS_EVERY_S:
            eta = sweep_eta(point_states(m), now)
            say(f"{entry.point_id}: {phase_text(progress or None, now)}; sweep {eta.text()}")
            last, last_at = key, now
        time.sleep(poll_s)


def _result_or_failure(job: Any, entry: PointEntry, m: Manifest) -> dict[str, Any]:
    try:
        return dict(job.results()[0])  # rank 0 speaks for the run
    except Exception as e:  # a rank died: the job may still have recorded its outcome
        from pipeline.submit.status import read_outcome, record_lost_point

        recorded = read_outcome(entry)  # written only as the point ends (e.g. a killed worker's peers)
        if recorded is not None:
            return recorded

        detail = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
        return record_lost_point(
            entry, detail, m.tracking_uri, m.parent_run_id, experiment=m.experiment, sweep_id=m.sweep_id
        )


class SubmissionError(RuntimeError):
    """sbatch refused a group; the groups already queued were cancelled."""


def _submit_slurm(pl: Plan, folder: Path, parent: Tracker) -> None:
    """One submitit job array per resource shape (one sbatch call each; a shape with more points
    than the cluster's MaxArraySize gets several arrays). If sbatch refuses a group, the groups
    already queued are cancelled: a sweep is submitted whole or not at all."""
    from pipeline.slurm.cluster import max_array_size

    m = pl.manifest
    groups = group_by_shape([(i, p.cfg) for i, p in enumerate(pl.points)])
    size = max_array_size()  # a group larger than the cluster's MaxArraySize: several arrays
    chunks = [(shape, idx[k : k + size]) for shape, idx in groups.items() for k in range(0, len(idx), size)]
    for shape, indices in chunks:
        executor = slurm_executor(
            folder, shape, pl.points[indices[0]].cfg.launcher, sweep_job_name(m.sweep_id)
        )
        jobs = []
        try:
            with executor.batch():
                for i in indices:
                    jobs.append(executor.submit(QualifyJob(spec_for(pl, pl.points[i], m.points[i]))))
        except Exception as e:
            from pipeline.slurm.commands import cancel

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
            finish_parent_run(m, parent, status="FAILED")
            raise SubmissionError(m.error) from e
        for i, job in zip(indices, jobs, strict=True):
            m.points[i].job_id = str(job.job_id)
            m.points[i].group = shape.label()


def unhealthy_nodes(entry: PointEntry) -> list[str]:
    """Every node that failed the health gate in one of the point's attempts."""
    nodes: set[str] = set()
    for record in PointDir(entry.point_dir).attempts():
        nodes.update(record.get("unhealthy_nodes", []))
    return sorted(nodes)


def resubmit_unhealthy(pl: Plan) -> list[str]:
    """launcher.exclude_unhealthy: each Slurm point whose last outcome is node_unhealthy is
    submitted again, alone, with `sbatch --exclude=<every node that failed it>` (submitit's
    `exclude` parameter); its manifest entry gets the new job id. The login node does this
    (while `qualify` waits), not the job: Slurm does not let a running or requeued job change
    its own excluded nodes. Returns the ids of the points submitted again."""
    m = pl.manifest
    again = []
    for p, entry in zip(pl.points, m.points, strict=True):
        outcome = PointDir(entry.point_dir).read_outcome() or {}
        if not p.cfg.launcher.exclude_unhealthy or outcome.get("reason") != K.REASON_NODE_UNHEALTHY:
            continue
        nodes = unhealthy_nodes(entry)
        if not nodes or len(PointDir(entry.point_dir).attempts()) > p.cfg.launcher.max_restarts:
            continue
        shape = ResourceShape.of(p.cfg)
        executor = slurm_executor(
            pl.sweep_dir / "submitit", shape, p.cfg.launcher, sweep_job_name(m.sweep_id)
        )
        executor.update_parameters(exclude=",".join(nodes))
        job = executor.submit(QualifyJob(spec_for(pl, p, entry)))
        print(
            f"  {entry.point_id}: node_unhealthy on {', '.join(nodes)}: submitted again as job {job.job_id} without it",
            flush=True,
        )
        PointDir(entry.point_dir).clear_outcome()
        entry.job_id = str(job.job_id)
        again.append(entry.point_id)
    if again:
        m.write(pl.sweep_dir)
    return again
