"""A sweep: compose and validate every point, write the manifest and the MLflow parent run,
then fan the points out (submitit local, or Slurm arrays grouped by resource shape). Nothing
is submitted unless every point is valid."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

from pipeline.config.compose import Point, compose_sweep
from pipeline.config.resolved import candidate_name, drill_label
from pipeline.config.schema import Config, ConfigError
from pipeline.config.validate import MemoryFit, check_points, memory_fit
from pipeline.contract.outcome import Reason, disk_full
from pipeline.contract.parent import close_if_done, parent_lock
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptRecord
from pipeline.contract.spec import JobSpec
from pipeline.contract.sweepdir import SweepDir
from pipeline.job.task import QualifyJob
from pipeline.sched import ClusterIdentity, LauncherKind, job_ref, scheduler_for, scheduler_on, sweep_job_name
from pipeline.sched import choose as choose_launcher
from pipeline.sched.warm import warm_ranks
from pipeline.submit.launcher import (
    ResourceShape,
    clusters_folder,
    group_by_shape,
    local_executor,
    slurm_executor,
)
from pipeline.submit.manifest import (
    Manifest,
    PointEntry,
    create_parent_run,
    finish_parent_run,
    log_manifest,
    new_sweep_id,
    parent_tracker,
    runs_root,
)
from pipeline.tracking import store
from pipeline.tracking.ledger import Tracker
from pipeline.tracking.redact import (
    REDACTED,
    adopt_credentials,
    is_secret_key,
    mark_secret,
    redact_text,
    redact_tree,
)

log = logging.getLogger(__name__)


@dataclass
class Plan:
    points: list[Point]
    launcher: str
    why: str
    sweep_dir: Path
    manifest: Manifest
    notes: list[str] = field(default_factory=list)  # one line each, printed before the sweep starts


def slurm_cluster_of(cfg: Config, login: str) -> str:
    """The Slurm cluster a point's partition lives on when it is not the login node's own
    (`login`: that one's ClusterName), else "" (no -M: the login node's slurm.conf)."""
    name = cfg.partition.slurm_cluster or ""
    return "" if name == login else name


def plan(sweep_name: str, user_overrides: Sequence[str], launcher_kind: str | None = None) -> Plan:
    """Compose + validate every point (raises ConfigError before anything exists on disk)."""
    points = [without_secrets(p) for p in compose_sweep(sweep_name, user_overrides)]
    if launcher_kind:
        points[0].cfg.launcher.kind = launcher_kind
    launcher, why = _launcher_of(points)
    if scheduler_for(launcher).keeps_jobs:  # a cluster's scheduler: its limits are checked
        home, others = _check_on_slurm(points, launcher)
    else:
        _check_locally(points)
        home, others = None, {}
    sweep_dir = runs_root(points[0].cfg.runs_dir) / new_sweep_id()
    manifest = _new_manifest(sweep_name, user_overrides, points[0].cfg, launcher, sweep_dir, home, others)
    login = manifest.cluster.get("name", "")
    for p, fit in zip(points, _fit_each(points), strict=True):
        manifest.points.append(
            PointEntry(
                point_id=p.point_id,
                index=p.index,
                overrides=p.overrides,
                candidate=candidate_name(p.cfg),
                partition=p.cfg.partition.name,
                drills=drill_label(p.cfg),
                point_dir=str(SweepDir(sweep_dir).point(p.point_id).path),
                mem_verdict=fit.verdict,
                # a sweep over several clusters names each point's, the login node's too: its jobs
                # are then addressed with -M wherever they are asked about (a job on the other
                # cluster asks its sweep's jobs from there)
                slurm_cluster=(slurm_cluster_of(p.cfg, login) or login) if others else "",
            )
        )
    return Plan(points, launcher, why, sweep_dir, manifest, notes=_local_setup_notes(points, launcher))


def _launcher_of(points: Sequence[Point]) -> tuple[LauncherKind, str]:
    """The scheduler the sweep runs on, and why (launcher.kind of its first point)."""
    first = points[0].cfg
    if first.launcher.kind == "auto" and not any(p.cfg.partition.slurm_partition for p in points):
        # the embedded default's points (partition=local) run here even where Slurm answers
        return LauncherKind.LOCAL, "no point names a Slurm partition (partition=local)"
    return choose_launcher(first.launcher)


def _check_on_slurm(
    points: Sequence[Point], launcher: LauncherKind
) -> tuple[ClusterIdentity | None, dict[str, dict[str, str]]]:
    """Every point against the cluster it runs on, one message per cluster (raises
    ConfigError). Returns the login node's identity where it had to be read first (a partition
    names a cluster: its name tells which partitions are its own) and each other cluster's
    identity, by name."""
    from pipeline.submit.checks import check_against_cluster, check_clusters_reachable

    named = any(p.cfg.partition.slurm_cluster for p in points)
    home = scheduler_for(launcher).identity() if named else None
    login = home.name if home else ""
    for shape in group_by_shape([(i, p.cfg) for i, p in enumerate(points)]):
        shape.check()  # nothing reaches sbatch or a Slurm command that could add lines to it
    on: dict[str, list[int]] = {}  # each cluster's points: "" for the login node's own
    for i, p in enumerate(points):
        on.setdefault(slurm_cluster_of(p.cfg, login), []).append(i)
    check_clusters_reachable(sorted(c for c in on if c))  # before any -M call: exit 2 if not
    if len(on) > 1 and points[0].cfg.sweep.adaptive:
        raise ConfigError(
            "sweep.adaptive runs its rounds from controller jobs on one cluster; this sweep's "
            f"partitions span the clusters {', '.join(sorted(c or login for c in on))} "
            "(partition.slurm_cluster): run an adaptive sweep per cluster, or sweep.adaptive=false. "
            "Nothing was submitted."
        )
    fits = _fit_each(points)
    others: dict[str, dict[str, str]] = {}
    for cluster, idx in sorted(on.items()):
        # the config's own checks and that cluster's, all problems of a cluster in one message
        check_against_cluster(
            [(points[i].point_id, points[i].cfg) for i in idx], fits=[fits[i] for i in idx], on=cluster
        )
        if cluster:
            others[cluster] = asdict(scheduler_on(launcher, cluster).identity())
    return home, others


def _check_locally(points: Sequence[Point]) -> None:
    """Every point against this machine, where the local launcher runs it (raises ConfigError)."""
    from pipeline.submit.checks import local_launcher_problems

    # where a point can run comes before whether it fits there
    local_problems = local_launcher_problems([(p.point_id, p.cfg) for p in points])
    if local_problems:
        raise ConfigError(
            "The local launcher cannot run these points; nothing was submitted:\n" + "\n".join(local_problems)
        )
    check_points([(p.point_id, p.cfg) for p in points], _fit_each(points))


def _new_manifest(
    sweep_name: str,
    user_overrides: Sequence[str],
    first: Config,
    launcher: LauncherKind,
    sweep_dir: Path,
    home: ClusterIdentity | None,
    others: dict[str, dict[str, str]],
) -> Manifest:
    """The sweep's manifest before its points: what it is, where it tracks (from its first
    point's config), and the clusters it runs on (`home`: the login node's identity, when read
    already)."""
    return Manifest(
        sweep_id=sweep_dir.name,
        sweep=sweep_name,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        launcher=launcher,
        tracking_uri=adopt_credentials(store.resolve_uri(first.tracking.uri)),
        experiment=redact_text(first.tracking.experiment, first.tracking.redact_patterns),
        user_overrides=redact_overrides(user_overrides, first.tracking.redact_patterns),
        # the login node's cluster, on its runs (sq.cluster*); each other cluster's on its own
        cluster=asdict(home or scheduler_for(launcher).identity()),
        clusters=others,
    )


def _fit_each(points: Sequence[Point]) -> list[MemoryFit]:
    """Each point's memory model, computed once (kept on the point) and carried from there to
    the checks and the manifest's verdict."""
    fits = []
    for p in points:
        fit = p.memory or memory_fit(p.cfg)
        p.memory = fit
        fits.append(fit)
    return fits


def _local_setup_notes(points: Sequence[Point], launcher: str) -> list[str]:
    """The local launcher runs no partition.setup line (they are the batch script's commands on
    Slurm): say so once, instead of letting the user believe `module load` or an export ran."""
    setups = sorted({line for p in points for line in p.cfg.partition.setup})
    if scheduler_for(launcher).runs_setup or not setups:
        return []
    return [
        f"[local] partition.setup ({len(setups)} line(s)) is not run by the local launcher: the points run "
        "in this shell's environment as it is (export what they need before `make sweep`); on Slurm the "
        "lines run at the top of the batch script"
    ]


def redact_overrides(overrides: Sequence[str], patterns: Sequence[str]) -> list[str]:
    """Overrides as they may be written or logged: secret keys' values ***, the rest through
    redact_text (user-info, credential-shaped text, values marked secret)."""
    out = []
    for o in overrides:
        key, sep, _ = o.partition("=")
        out.append(
            f"{key}={REDACTED}"
            if sep and is_secret_key(key.lstrip("+~"), patterns)
            else redact_text(o, patterns)
        )
    return out


def without_secrets(p: Point) -> Point:
    """The point as the sweep writes it and hands it to its job: a tracking URI's user-info
    moved to the environment MLflow reads (jobs inherit it; nothing on disk holds it), and
    secret values redacted from the resolved config and the overrides."""
    import yaml

    patterns = p.cfg.tracking.redact_patterns
    for value in p.cfg.tracking.secrets:
        mark_secret(value)
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
        parent_ledger_dir=str(SweepDir(pl.sweep_dir).parent_ledger),
        cluster=dict(m.clusters.get(entry.slurm_cluster, m.cluster) if entry.slurm_cluster else m.cluster),
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
    if problem is None and (refused := store.refused_credentials(m.tracking_uri)):
        raise ConfigError(
            f"Invalid value for 'tracking.uri': the MLflow server refuses this sweep: {refused}. Allowed: the "
            "server's credentials in MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or ~/.netrc, or "
            "user:password@ in tracking.uri). Nothing was submitted."
        )
    if problem:
        log.warning(
            "MLflow unreachable: %s. The sweep goes on; every run is kept in its ledger under %s. "
            "Replay them once it answers: make sync SWEEP=%s",
            problem,
            pl.sweep_dir,
            m.sweep_id,
        )
    pl.sweep_dir.mkdir(parents=True, exist_ok=True)
    write_point_files(pl)
    parent = create_parent_run(m, pl.sweep_dir, offline=problem is not None)  # needs no manifest
    folder = SweepDir(pl.sweep_dir).submitit
    pairs = list(zip(pl.points, m.points, strict=True))
    if scheduler_for(pl.launcher).keeps_jobs:
        # written before sbatch, so that a login node dying between sbatch and the next write
        # leaves the sweep findable (status, cancel by the job name) by its queued jobs
        log_manifest(m, m.write(pl.sweep_dir), parent)
        _submit_slurm(pl, pairs, folder, parent)  # on SubmissionError the parent run ended FAILED
        m.submitted = True
        # the one write after sbatch: the job ids exist only now
        log_manifest(m, m.write(pl.sweep_dir), parent)
        parent.close(terminate=False)  # `status` ends it once every point has its outcome
        return m
    # local: nothing runs before run_local, so the manifest is written once, complete (each
    # point's job id is added by run_local as that point starts)
    m.submitted = True
    m.submit_pid, m.submit_host = os.getpid(), socket.gethostname()
    log_manifest(m, m.write(pl.sweep_dir), parent)
    parent.close(terminate=False)  # closed by the last point to end (or by this, below)
    run_local(pl, pairs, parent, on_result, on_progress)
    return m


def run_local(
    pl: Plan,
    pairs: list[tuple[Point, PointEntry]],
    parent: Tracker,
    on_result: Any = None,
    on_progress: Any = None,
) -> None:
    """The embedded default: run `pairs` here, one after another (each already uses several
    ranks), then close the parent run if every point of the sweep has ended. Ctrl-C ends the
    point that runs and every point without an outcome (`interrupted`). `on_result(entry,
    result)` as each point ends; `on_progress(line)` while one runs."""
    m = pl.manifest
    folder = SweepDir(pl.sweep_dir).submitit
    job: Any = None
    ranks = contextlib.ExitStack()  # the warm ranks' server outlives an interrupted point's end
    try:
        _hangup_as_interrupt()
        python = (
            ranks.enter_context(warm_ranks(folder)) if pairs and pairs[0][0].cfg.launcher.warm_ranks else None
        )
        for p, entry in pairs:
            executor = local_executor(folder, p.cfg, python=python)
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
    finally:
        ranks.close()
        _hangup_as_interrupt(restore=True)
    with parent_lock(pl.sweep_dir):
        log_manifest(m, m.write(pl.sweep_dir), parent_tracker(m, pl.sweep_dir, offline=parent.offline))
    close_if_done(pl.sweep_dir, by=f"sweep pid {os.getpid()}")


_HUP_BEFORE: list[Any] = []


def _hangup_as_interrupt(restore: bool = False) -> None:
    """A local sweep whose terminal closes (SIGHUP) ends as after Ctrl-C: Python's own SIGINT
    handler (it raises KeyboardInterrupt) for SIGHUP while the points run, the previous one after.
    Only the main thread can set a handler; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        return
    if restore:
        if _HUP_BEFORE:
            signal.signal(signal.SIGHUP, _HUP_BEFORE.pop())
        return
    _HUP_BEFORE.append(signal.signal(signal.SIGHUP, signal.default_int_handler))


def _interrupted(pl: Plan, job: Any) -> None:
    """Ctrl-C on a local sweep: its running point is stopped, and every point without an
    outcome ends failed (`interrupted`), its MLflow run KILLED; then the parent run, KILLED."""
    from pipeline.submit.status import read_outcome, record_stopped

    m = pl.manifest
    if job is not None:
        with contextlib.suppress(Exception):
            job.cancel(check=False)
            deadline = time.monotonic() + 30  # its ranks save nothing: they only need to exit
            while not job.done() and time.monotonic() < deadline:
                time.sleep(0.5)
    for entry in m.points:
        if read_outcome(entry) is None:
            record_stopped(entry, m)
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
        from submitit.core.utils import UncompletedJobError

        full = disk_full(e, carriers=(UncompletedJobError,))  # its log tail: no room was left for the outcome
        return record_lost_point(
            entry,
            f"{full} (the job could not write its outcome): {detail}" if full else detail,
            m.tracking_uri,
            m.parent_run_id,
            reason=Reason.DISK_FULL if full else Reason.CRASH,
            experiment=m.experiment,
            sweep_id=m.sweep_id,
        )


class SubmissionError(RuntimeError):
    """sbatch refused a group; the groups already queued were cancelled."""


def _submit_slurm(
    pl: Plan,
    pairs: list[tuple[Point, PointEntry]],
    folder: Path,
    parent: Tracker,
    hold: bool = False,
    whole_sweep: bool = True,
) -> None:
    """One submitit job array per resource shape (one sbatch call each; a shape with more points
    than the cluster's MaxArraySize gets several arrays; each honours launcher.array_parallelism
    as Slurm's `%N`). If sbatch refuses a group, the groups already queued are cancelled: a
    sweep is submitted whole or not at all. hold: the arrays are queued held (`--hold`; an
    adaptive round records their ids before it releases them). whole_sweep=False (a later
    adaptive round): a refusal raises SubmissionError without marking the sweep failed."""
    queued: list[PointEntry] = []
    for cluster, shape, indices in _array_chunks(pl, pairs):
        executor = slurm_executor(
            clusters_folder(folder, cluster),
            shape,
            pairs[indices[0]][0].cfg.launcher,
            sweep_job_name(pl.manifest.sweep_id),
            cluster=cluster,
        )
        if hold:
            extra = dict(executor.parameters.get("additional_parameters") or {})
            executor.update_parameters(additional_parameters={**extra, "hold": True})
        jobs = []
        try:
            with executor.batch():
                for i in indices:
                    jobs.append(executor.submit(QualifyJob(spec_for(pl, *pairs[i]))))
        except Exception as e:
            _roll_back(pl, queued, shape, e, parent, whole_sweep)
        for i, job in zip(indices, jobs, strict=True):
            entry = pairs[i][1]
            entry.job_id, entry.group = job_ref(cluster, str(job.job_id)), shape.label()
            queued.append(entry)


def _array_chunks(
    pl: Plan, pairs: list[tuple[Point, PointEntry]]
) -> list[tuple[str, ResourceShape, list[int]]]:
    """The job arrays to submit: (cluster, shape, indices into `pairs`), one per cluster and
    resource shape, split at that cluster's MaxArraySize ("": the login node's own cluster)."""
    on: dict[str, list[tuple[int, Config]]] = {}
    for i, (point, entry) in enumerate(pairs):
        on.setdefault(entry.slurm_cluster, []).append((i, point.cfg))
    chunks: list[tuple[str, ResourceShape, list[int]]] = []
    for cluster, cfgs in sorted(on.items()):
        size = scheduler_on(pl.launcher, cluster).max_array_size()
        for shape, idx in group_by_shape(cfgs).items():
            chunks += [(cluster, shape, idx[k : k + size]) for k in range(0, len(idx), size)]
    return chunks


def _roll_back(
    pl: Plan,
    queued: list[PointEntry],
    shape: ResourceShape,
    e: Exception,
    parent: Tracker,
    whole_sweep: bool,
) -> NoReturn:
    """sbatch refused `shape`'s group: cancel the jobs of this submission already `queued`
    (each on its own cluster) and raise SubmissionError; a whole sweep is recorded failed."""
    m = pl.manifest
    scheduler_for(pl.launcher).cancel([p.job_id for p in queued], best_effort=True)
    for p in queued:
        p.job_id = ""
    detail = str(e).strip().splitlines()[-1][:500] if str(e).strip() else type(e).__name__
    if not whole_sweep:
        raise SubmissionError(
            f"sbatch refused group {shape.label()}: {detail}. Cancelled the {len(queued)} job(s) "
            "of this submission already queued."
        ) from e
    m.error = (
        f"sbatch refused group {shape.label()}: {detail}. "
        f"Cancelled the {len(queued)} job(s) already queued; nothing of sweep {m.sweep_id} runs."
    )
    m.write(pl.sweep_dir)
    finish_parent_run(m, parent, status="FAILED")
    raise SubmissionError(m.error) from e


def unhealthy_nodes(entry: PointEntry) -> list[str]:
    """Every node that failed the health gate in one of the point's attempts."""
    nodes: set[str] = set()
    for record in AttemptRecord.read_all(PointDir(entry.point_dir).attempts()):
        nodes.update(record.unhealthy_nodes or [])
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
        if not p.cfg.launcher.exclude_unhealthy or outcome.get("reason") != Reason.NODE_UNHEALTHY:
            continue
        nodes = unhealthy_nodes(entry)
        if not nodes or len(PointDir(entry.point_dir).attempts()) > p.cfg.launcher.max_restarts:
            continue
        shape = ResourceShape.of(p.cfg)
        executor = slurm_executor(
            clusters_folder(SweepDir(pl.sweep_dir).submitit, entry.slurm_cluster),
            shape,
            p.cfg.launcher,
            sweep_job_name(m.sweep_id),
            cluster=entry.slurm_cluster,
        )
        executor.update_parameters(exclude=",".join(nodes))
        job = executor.submit(QualifyJob(spec_for(pl, p, entry)))
        log.info(
            "%s: node_unhealthy on %s: submitted again as job %s without it",
            entry.point_id,
            ", ".join(nodes),
            job.job_id,
        )
        PointDir(entry.point_dir).clear_outcome()
        entry.job_id = job_ref(entry.slurm_cluster, str(job.job_id))
        again.append(entry.point_id)
    if again:
        m.write(pl.sweep_dir)
    return again


def resume(
    sweep_dir: Path, entries: Sequence[PointEntry], on_result: Any = None, on_progress: Any = None
) -> Manifest:
    """Run `entries` of a submitted sweep again (pipeline.submit.control.reopen made them
    ready): from their own folders' configs, with the sweep's launcher, into the same runs;
    each job resumes from its newest good checkpoint."""
    from pipeline.config.resolved import config_from_yaml

    m = Manifest.read(sweep_dir)
    wanted = {e.point_id for e in entries}
    pairs = []
    for entry in m.points:
        if entry.point_id in wanted:
            text = PointDir(entry.point_dir).config.read_text()
            pairs.append((Point(entry.index, entry.overrides, config_from_yaml(text), text), entry))
    pl = Plan([p for p, _ in pairs], m.launcher, "resume", sweep_dir, m)
    store.bound_http_requests()
    parent = parent_tracker(m, sweep_dir, offline=store.unreachable(m.tracking_uri) is not None)
    if scheduler_for(m.launcher).keeps_jobs:
        _submit_slurm(pl, pairs, SweepDir(sweep_dir).submitit, parent)
        log_manifest(m, m.write(sweep_dir), parent)
        parent.close(terminate=False)
        return m
    m.submit_pid, m.submit_host = os.getpid(), socket.gethostname()
    m.write(sweep_dir)
    parent.close(terminate=False)
    run_local(pl, pairs, parent, on_result, on_progress)
    return m
