"""One Slurm (or local) job = one sweep point, on every rank. Wires the trainer to tracking,
drills and measurements, and turns whatever happens into an outcome: accepted, or failed with
a reason. A failing point never raises past here, so it never stops the other points."""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import socket
import subprocess
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from pipeline import logs
from pipeline.config.resolved import candidate_name, config_from_yaml, drill_label, series_name
from pipeline.contract.accounting import attempt_record, needed_person, run_totals
from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptRecord, StopReason, StopRecord
from pipeline.contract.retention import kept_checkpoint_bytes
from pipeline.contract.spec import JobSpec, PointEnd
from pipeline.files import write_atomic
from pipeline.job.attempt import AttemptContext, AttemptStopped
from pipeline.job.distributed import RankEnv, process_start_time, rank_env_from_submitit
from pipeline.job.drills import read_stop_record, requeue_and_exit, write_stop_record
from pipeline.job.progress import progress_for
from pipeline.job.recorder import Recorder
from pipeline.job.results import classify
from pipeline.job.stack import CONTAINER_ENV
from pipeline.job.startup import (
    ABANDONED_LOCK_S,
    BuildLockWatch,
    extensions_root,
    use_interpreter_toolchain,
    use_venv_ops_cache,
)
from pipeline.sched import JobIdentity, scheduler_for, scheduler_of
from pipeline.sched.warm import started_warm
from pipeline.tracking import keys as K
from pipeline.tracking import store
from pipeline.tracking.ledger import flatten
from pipeline.train.progress import FINISHING

if TYPE_CHECKING:
    from pipeline.train.trainer import StopFlag

log = logging.getLogger(__name__)


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> str:
    import deepspeed
    import mlflow
    import torch

    return f"python={platform.python_version()} torch={torch.__version__} deepspeed={deepspeed.__version__} mlflow={mlflow.__version__}"


def run_point(spec: JobSpec, renv: RankEnv | None = None) -> dict[str, Any]:
    from pipeline.train.trainer import StopFlag

    process_start = process_start_time()
    logs.setup()  # one line per record, into the job's log
    stop = StopFlag()
    install_stop_handlers(stop)  # first thing: a warning that comes during start-up is kept
    # bounded MLflow HTTP retries: a dead server must not hold a finished job for minutes
    store.bound_http_requests(store.JOB_HTTP_TIMEOUT_S)
    use_interpreter_toolchain()  # the venv's ninja finds the ops built at install: nothing compiles here
    use_venv_ops_cache()  # in the venv's own cache, where the install built them
    # a build lock a killed process leaves, now or while this rank loads its ops, is removed
    # inside an image with its own pid namespace the ranks of other containers on this node are
    # not in /proc: a lock one of them holds looks like no one's, so only the abandoned age counts
    in_image = bool(os.environ.get(CONTAINER_ENV))
    locks = BuildLockWatch(
        extensions_root(),
        lambda lock: log.warning("removed a stale op build lock: %s", lock),
        **({"stale_s": ABANDONED_LOCK_S} if in_image else {}),
    )
    locks.start()
    try:
        return _run_attempt(spec, renv, process_start, stop)
    finally:
        locks.stop()


def _run_attempt(spec: JobSpec, renv: RankEnv | None, process_start: float, stop: StopFlag) -> dict[str, Any]:
    cfg = config_from_yaml(spec.config_yaml)
    renv = renv or rank_env_from_submitit()
    point = PointDir(spec.point_dir).create()
    job = scheduler_for(spec.launcher).this_job()
    ended = point.read_outcome()
    if ended is not None:
        # the point ended for good in an earlier allocation (Slurm ran the job once more: an
        # admin's requeue, a node failure during teardown): its record is final, and stays so
        log.info(
            "rank %d: point %s already ended %s (%s); this allocation does nothing",
            renv.rank,
            spec.point_id,
            ended.get("outcome"),
            ended.get("reason") or "no reason",
        )
        if renv.is_main:
            _close_parent_if_last(spec, job)
        return dict(ended)
    prior = tuple(AttemptRecord.read_all(point.attempts()))
    ctx = AttemptContext(
        spec=spec,
        cfg=cfg,
        renv=renv,
        point=point,
        process_start=process_start,
        stop=stop,
        recorder=Recorder.open(spec, cfg, renv),
        prior=prior,
        prev_stop=read_stop_record(point),
        slurm=job,
        progress=progress_for(point.write_progress if renv.is_main else None, len(prior), process_start),
    )
    return _AttemptCloser(ctx).run()


class _AttemptCloser:
    """Closes an attempt on one rank: runs it (pipeline.job.runner.Attempt), then ends it with its
    outcome or its requeue, and logs the point's totals."""

    def __init__(self, ctx: AttemptContext) -> None:
        self.ctx = ctx

    def run(self) -> dict[str, Any]:
        from pipeline.job.runner import execute

        ctx = self.ctx
        self._log_identity()
        try:
            end = execute(ctx)
        except AttemptStopped as stopped:
            # _stopped returns only for good; then the rank that records the stop records the end
            ended = self._stopped(stopped)
            stopped.stop.exit_time = time.time()
            record = replace(stopped.record, **_stop_facts(stopped.stop))
            return self._finish(ended, record, stopped.stop.writer_rank)
        except Exception as e:  # every failure is a result of this point, never of the sweep
            outcome, reason, detail = classify(e)
            trace = traceback.format_exc()
            log.error("rank %d: %s %s: %s\n%s", ctx.renv.rank, outcome, reason, detail, trace)
            if ctx.renv.is_main:  # the traceback a person acts on, beside the run
                write_atomic(ctx.point.traceback, trace)
                ctx.recorder.artifact(ctx.point.traceback)
            return self._finish(
                PointEnd(outcome, reason, detail),
                attempt_record(ctx.process_start, ctx.renv.world_size),
            )
        return self._finish(end.outcome, end.record)

    def _finish(self, outcome: PointEnd, record: AttemptRecord, writer_rank: int = 0) -> dict[str, Any]:
        """The point ended: one rank (rank 0, or `writer_rank`) records the attempt, the run's
        time and cost over all attempts (from Slurm's accounting when there is one), and the
        outcome."""
        ctx = self.ctx
        ctx.progress.phase(FINISHING, f"recording the outcome ({outcome.outcome})")
        writer = ctx.renv.rank == writer_rank
        ctx.recorder.tags(
            {
                K.TAG_OUTCOME: outcome.outcome,
                K.TAG_REASON: outcome.reason,
                K.TAG_REASON_DETAIL: outcome.detail,
            }
        )
        log_path = _job_log_path()
        if log_path is not None:
            ctx.recorder.artifact(log_path)
        if writer:
            record = replace(
                record,
                **ctx.slurm_facts(),
                outcome=outcome.outcome,
                needed_person=needed_person(outcome.outcome, outcome.reason),
            )
            ctx.recorder.flush()  # what is left after sacct's read is the close: a few lines
            self._log_totals([*ctx.prior, record])
        outcome.metrics.update(ctx.recorder.values)
        ctx.recorder.close("FINISHED" if outcome.outcome == Outcome.ACCEPTED else "FAILED")
        summary = {"point_id": ctx.spec.point_id, "candidate": candidate_name(ctx.cfg), **asdict(outcome)}
        if writer:
            ctx.point.append_attempt(record.to_json())
            ctx.point.write_outcome(summary)
            ctx.point.clear_stop()
            _close_parent_if_last(ctx.spec, ctx.slurm)
        ctx.progress.close()
        return summary

    def _log_totals(self, attempts: list[AttemptRecord]) -> None:
        """Time, goodput and cost of the whole point, read once as it ends, as late as the job
        can. On Slurm the allocated time is sacct's, for every allocation of the job (requeues
        included); the current allocation's is its time so far: Slurm's own teardown after the
        job exits (srun, the batch script, the epilog) is not in it."""
        ctx = self.ctx
        job_id = ctx.slurm.job_id if ctx.slurm else ""
        allocations = scheduler_of(ctx.slurm).allocations(job_id, ctx.slurm.name) if ctx.slurm else None
        if job_id and allocations is None:
            log.warning("sacct has no record of job %s: allocated time from the process clock", job_id)
        elif allocations is not None and len(allocations) != len(attempts):
            log.warning(
                "sacct bills %d allocation(s) for %d attempt(s) of job %s: the cost follows sacct",
                len(allocations),
                len(attempts),
                job_id,
            )
        totals, source = run_totals(
            ctx.cfg, attempts, kept_checkpoint_bytes(ctx.point.checkpoints), allocations
        )
        ctx.recorder.log(totals)
        ctx.recorder.tags({K.TAG_ALLOCATED_SOURCE: source})
        for i, alloc in enumerate(allocations or []):  # oldest first: step = the attempt's index
            if alloc.queue_wait_s is not None:
                ctx.recorder.log({K.TIME_QUEUE_WAIT_S: alloc.queue_wait_s}, step=i)

    def _stopped(self, stopped: AttemptStopped) -> PointEnd:
        """Saved at a step boundary after a signal, or a peer died: requeue, unless the run
        cannot come back (then the outcome)."""
        ctx, record = self.ctx, stopped.stop
        launcher, part = ctx.cfg.launcher, ctx.cfg.partition
        if (
            record.reason == StopReason.TIMEOUT
            and ctx.restarts(StopReason.TIMEOUT) >= launcher.max_num_timeout
        ):
            return PointEnd(
                Outcome.FAILED, Reason.TIMEOUT, f"timed out more than {launcher.max_num_timeout} times"
            )
        if record.reason == StopReason.PREEMPT and part.preempt_mode == "cancel":
            return PointEnd(
                Outcome.FAILED,
                Reason.PREEMPT_CANCELLED,
                f"preempted on partition '{part.name}', whose PreemptMode cancels jobs instead of requeueing them",
            )
        if (
            record.reason in (StopReason.PREEMPT, StopReason.PEER_FAILURE)
            and ctx.restarts(record.reason) >= launcher.max_restarts
        ):
            if (
                record.reason == StopReason.PREEMPT
            ):  # the partition's preemption rate: a result, no person needed
                return PointEnd(
                    Outcome.FAILED, Reason.PREEMPTED, f"preempted more than {launcher.max_restarts} times"
                )
            return PointEnd(
                Outcome.FAILED, Reason.CRASH, f"workers failed more than {launcher.max_restarts} times"
            )
        self._leave(record, stopped.record, requeue=record.reason != StopReason.TERMINATED)

    def _leave(self, stop: StopRecord, attempt: AttemptRecord, requeue: bool) -> NoReturn:
        """End this attempt: its record, the stop record for the next one's restart time, then
        requeue. One rank writes (rank 0, or rank 1 when rank 0 is the one that died)."""
        ctx = self.ctx
        ctx.progress.phase(FINISHING, f"stopped ({stop.reason}) at step {stop.stop_step}: requeueing")
        ctx.progress.close()
        ctx.recorder.tags({K.TAG_OUTCOME: Outcome.RUNNING, K.TAG_LAST_STOP: stop.reason})
        ctx.recorder.close(terminate=False)  # the next attempt logs into the same run
        stop.exit_time = time.time()
        writer = ctx.renv.rank == stop.writer_rank
        if writer:
            ctx.point.append_attempt(
                replace(attempt, **ctx.slurm_facts(), **_stop_facts(stop), end=stop.exit_time).to_json()
            )
            write_stop_record(ctx.point, stop)
        log.info(
            "rank %d: %s at step %s: %s",
            ctx.renv.rank,
            stop.reason,
            stop.stop_step,
            "requeueing" if requeue else "leaving it to Slurm",
        )
        if requeue and (writer or stop.reason == StopReason.PEER_FAILURE):
            requeue_and_exit(ctx.slurm)
        os._exit(0)

    def _log_identity(self) -> None:
        ctx = self.ctx
        cfg, renv = ctx.cfg, ctx.renv
        if not renv.is_main:
            return
        from omegaconf import OmegaConf

        ctx.recorder.params(flatten(OmegaConf.to_container(OmegaConf.create(ctx.spec.config_yaml))))  # type: ignore[arg-type]
        slurm = _slurm_tags(ctx.slurm)
        ctx.recorder.tags(
            {
                K.TAG_PARENT_KIND: ctx.spec.kind,
                K.TAG_SWEEP_ID: ctx.spec.sweep_id,
                K.TAG_POINT_ID: ctx.spec.point_id,
                K.TAG_CANDIDATE: candidate_name(cfg),
                K.TAG_PARTITION: cfg.partition.name,
                K.TAG_GPU_TYPE: cfg.partition.gpu_type,
                K.TAG_MODEL: cfg.model.name,
                **_model_tags(cfg.model),
                K.TAG_METHOD: cfg.method.name,
                K.TAG_PRECISION: cfg.precision.name,
                K.TAG_PARALLELISM: cfg.parallelism.name,
                K.TAG_DRILLS: drill_label(cfg),
                K.TAG_OUTCOME: Outcome.RUNNING,
                K.TAG_HOST: socket.gethostname(),
                K.TAG_GIT_SHA: git_sha(),
                K.TAG_VERSIONS: versions(),
                K.TAG_LAUNCHER: ctx.spec.launcher,
                **K.cluster_tags(ctx.spec.cluster),
                K.TAG_RANKS: "warm" if started_warm() else "cold",
                K.TAG_GPUS: renv.world_size,
                K.TAG_SERIES: f"{ctx.spec.sweep_id}/{series_name(cfg)}",  # its sizes: one scaling series
                K.TAG_PRICE_DATE: cfg.partition.price_date,
                K.TAG_PRICE_SOURCE: cfg.partition.price_source,
                K.TAG_PEAK_SOURCE: cfg.partition.peak_source,
                **{k: v for k, v in slurm.items() if v},
            }
        )
        write_atomic(ctx.point.config, ctx.spec.config_yaml)
        ctx.recorder.artifact(ctx.point.config)


def _stop_facts(stop: StopRecord) -> dict[str, Any]:
    """What a stopped attempt adds to its record (pipeline.contract.records.StopRecord.attempt_facts)."""
    return stop.attempt_facts()


def _slurm_tags(job: JobIdentity | None) -> dict[str, Any]:
    """Slurm's view of the job, as tags; none for a point that is not a Slurm job of ours."""
    if job is None:
        return {}
    env = os.environ
    return {
        K.TAG_SLURM_JOB_ID: job.job_id,
        K.TAG_SLURM_ARRAY_TASK_ID: job.array_task_id,
        K.TAG_SLURM_NODELIST: job.nodelist,
        K.TAG_SLURM_PARTITION: env.get("SLURM_JOB_PARTITION", ""),
        K.TAG_SLURM_NODENAME: env.get("SLURMD_NODENAME", ""),
        K.TAG_SLURM_GPUS: env.get("SLURM_JOB_GPUS", env.get("CUDA_VISIBLE_DEVICES", "")),
        K.TAG_SLURM_GRES: env.get("SLURM_JOB_GRES", env.get("SQ_GRES", "")),
        K.TAG_RESTARTS: str(job.restart_count),
    }


def _close_parent_if_last(spec: JobSpec, job: JobIdentity | None) -> None:
    """The last point of a sweep to end closes the sweep's parent run (after its own run ended
    and its outcome is on disk), once no other point's job is still in Slurm: a sweep nobody
    watches still ends FINISHED."""
    if not spec.parent_ledger_dir:
        return
    from pipeline.contract.parent import close_if_done

    try:
        by = f"job {job.job_id}" if job else f"pid {os.getpid()}"
        own = {"own_job": job.job_id, "own_cluster": job.cluster} if job else {}
        if close_if_done(Path(spec.parent_ledger_dir).parent, by=by, **own):
            log.info("the last point of the sweep: closed the sweep's parent run")
    except Exception as e:  # never fails the point
        log.warning("could not close the sweep's parent run: %s", e)


def _job_log_path() -> Path | None:
    """The rank's stdout file that submitit (or Slurm) captures: the job log artifact."""
    try:
        import submitit

        env = submitit.JobEnvironment()
        return Path(env.paths.stdout) if Path(env.paths.stdout).exists() else None
    except Exception:
        return None


def install_stop_handlers(stop: Any, signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)) -> None:
    """A handler only sets the flag; the ranks act on it at the next step boundary."""

    def handler(signum: int, frame: Any) -> None:
        stop.set(signal.Signals(signum).name)

    for sig in signals:
        signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.job.entry spec.json` on every rank, for ranks started by srun or by hand
    (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or SLURM_PROCID/SLURM_NTASKS, in the env)."""
    import sys

    from pipeline.job.distributed import rank_env_from_environ

    logs.setup()  # before the rank's place is read: its `[rank]` line is a record too
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipeline.job.entry SPEC.json", file=sys.stderr)
        return 2
    spec = JobSpec(**json.loads(Path(argv[0]).read_text()))
    summary = run_point(spec, rank_env_from_environ())
    return 0 if summary["outcome"] == Outcome.ACCEPTED else 1


def _model_tags(model: Any) -> dict[str, str]:
    """The model as built: its family, and for a model.pretrained folder the folder and the
    sha256 of its config.json (config.yaml already holds its shape from config.json)."""
    tags = {K.TAG_MODEL_FAMILY: model.model_type}
    if model.pretrained:
        import hashlib

        from pipeline.config.pretrained import read_pretrained

        folder = read_pretrained(model.pretrained).folder
        tags[K.TAG_MODEL_FOLDER] = str(folder)
        tags[K.TAG_MODEL_CONFIG_SHA256] = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()
    return tags


if __name__ == "__main__":
    raise SystemExit(main())
