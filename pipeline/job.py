"""One Slurm (or local) job = one sweep point, on every rank. Wires the trainer to tracking,
drills and measurements, and turns whatever happens into an outcome: accepted, or failed with
a reason. A failing point never raises past here, so it never stops the other points."""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import subprocess
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pipeline import keys as K
from pipeline.checkpoint import step_of
from pipeline.compose import PROJECT_ROOT, candidate_name, config_from_yaml, drill_label
from pipeline.config import Config
from pipeline.distributed import RankEnv, process_start_time, rank_env_from_submitit
from pipeline.drills import (
    StopRecord,
    clear_stop_record,
    is_peer_failure,
    read_kill_record,
    requeue_and_exit,
    write_stop_record,
)
from pipeline.tracking import NullTracker, Tracker, flatten, resolve_uri


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


@dataclass
class Outcome:
    outcome: str
    reason: str = ""
    detail: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), "rev-parse", "--short=12", "HEAD"],
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


def classify(exc: BaseException) -> tuple[str, str]:
    """(reason, one-line detail) for an exception that ended a run."""
    from pipeline.trainer import UnsupportedPrecision

    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    if isinstance(exc, UnsupportedPrecision) or "not supported on your device" in str(exc):
        return K.REASON_UNSUPPORTED_PRECISION, text
    if "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError":
        return K.REASON_OOM, text
    return K.REASON_CRASH, text


class QualifyJob:
    """The callable submitit pickles: `QualifyJob(spec)()` runs on every rank."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    def __call__(self) -> dict[str, Any]:
        return run_point(self.spec)

    def checkpoint(self) -> Any:
        """Only reached if a signal beats our own handler (it arrives while the job is still
        unpickling): our state is in the last checkpoint, so submitit may simply requeue us."""
        import submitit

        return submitit.helpers.DelayedSubmission(QualifyJob(self.spec))


def run_point(spec: JobSpec, renv: RankEnv | None = None) -> dict[str, Any]:
    from pipeline.trainer import StopFlag

    process_start = process_start_time()
    stop = StopFlag()
    install_stop_handlers(stop)  # first thing: a warning that comes during start-up is kept
    # bounded MLflow HTTP retries: a dead server must not hold a finished job for minutes
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    cfg = config_from_yaml(spec.config_yaml)
    renv = renv or rank_env_from_submitit()
    point_dir = Path(spec.point_dir)
    point_dir.mkdir(parents=True, exist_ok=True)
    tracker = _tracker(spec, cfg, renv)
    result = _Attempt(spec, cfg, renv, point_dir, tracker, process_start, stop).run()
    return result


def _tracker(spec: JobSpec, cfg: Config, renv: RankEnv) -> NullTracker:
    if not renv.is_main or not cfg.tracking.enabled:
        return NullTracker()
    return Tracker(
        resolve_uri(spec.tracking_uri),
        cfg.tracking.experiment,
        Path(spec.point_dir) / "tracking",
        run_name=spec.point_id,
        parent_run_id=spec.parent_run_id,
        flush_every_s=cfg.tracking.flush_every_s,
    )


class _Attempt:
    """One attempt of a run on one rank (rank 0 also logs)."""

    def __init__(
        self,
        spec: JobSpec,
        cfg: Config,
        renv: RankEnv,
        point_dir: Path,
        tracker: NullTracker,
        process_start: float,
        stop: Any,
    ) -> None:
        self.spec, self.cfg, self.renv, self.point_dir, self.tracker = spec, cfg, renv, point_dir, tracker
        self.process_start = process_start
        self.stop = stop  # set by the signal handlers, read by the trainer at step boundaries
        self.metrics: dict[str, float] = {}
        self.trainer: Any = None  # set once built, so a failure can still save what it knows
        self.prev_stop: StopRecord | None = None  # how the previous attempt ended
        self.gpu_mismatch: str | None = None  # the GPU is not the partition's type

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.update(metrics)
        self.tracker.log_metrics(metrics, step)

    def run(self) -> dict[str, Any]:
        from pipeline.runner import AttemptStopped

        self._log_identity()
        try:
            outcome = self._train()
        except AttemptStopped as stopped:
            outcome = self._stopped(stopped.record)  # returns only when the run cannot go on
        except Exception as e:  # every failure is a result of this point, never of the sweep
            reason, detail = classify(e)
            if reason == K.REASON_CRASH and is_peer_failure(e) and self.trainer is not None:
                outcome = self._peer_failed(e)  # returns only when the run cannot go on
            else:
                trace = f"\n{traceback.format_exc()}" if reason == K.REASON_CRASH else ""
                print(f"[job] rank {self.renv.rank}: {reason}: {detail}{trace}", flush=True)
                outcome = Outcome(K.OUTCOME_FAILED, reason, detail)
        return self._finish(outcome)

    def _finish(self, outcome: Outcome) -> dict[str, Any]:
        outcome.metrics.update(self.metrics)
        self.tracker.set_tags(
            {
                K.TAG_OUTCOME: outcome.outcome,
                K.TAG_REASON: outcome.reason,
                K.TAG_REASON_DETAIL: outcome.detail,
            }
        )
        log_path = _job_log_path()
        if log_path is not None:
            self.tracker.log_artifact(log_path)
        self.tracker.close("FINISHED" if outcome.outcome == K.OUTCOME_ACCEPTED else "FAILED")
        summary = {"point_id": self.spec.point_id, "candidate": candidate_name(self.cfg), **asdict(outcome)}
        if self.renv.is_main:
            _write_json(self.point_dir / "outcome.json", summary)
            clear_stop_record(self.point_dir)
        return summary

    def _restarts_so_far(self, reason: str) -> int:
        from pipeline.accounting import prior_attempts

        return sum(1 for a in prior_attempts(self.point_dir) if a.get("stop") == reason)

    def _stopped(self, record: StopRecord) -> Outcome:
        """Saved at a step boundary after a signal: requeue, unless the run cannot come back."""
        launcher, part = self.cfg.launcher, self.cfg.partition
        if record.reason == "timeout" and self._restarts_so_far("timeout") >= launcher.max_num_timeout:
            return Outcome(
                K.OUTCOME_FAILED, K.REASON_TIMEOUT, f"timed out more than {launcher.max_num_timeout} times"
            )
        if record.reason == "preempt" and part.preempt_mode == "cancel":
            return Outcome(
                K.OUTCOME_FAILED,
                K.REASON_PREEMPT_CANCELLED,
                f"preempted on partition '{part.name}', whose PreemptMode cancels jobs instead of requeueing them",
            )
        if record.reason == "preempt" and self._restarts_so_far("preempt") >= launcher.max_restarts:
            return Outcome(
                K.OUTCOME_FAILED, K.REASON_CRASH, f"preempted more than {launcher.max_restarts} times"
            )
        self._leave(record, requeue=record.reason != "terminated")

    def _peer_failed(self, exc: BaseException) -> Outcome:
        """Another rank died mid-step (the kill_worker drill, or a real node failure): requeue
        and resume from the last checkpoint, within the allowed restarts."""
        from pipeline.accounting import append_attempt, attempt_record

        trainer = self.trainer
        assert trainer is not None
        print(
            f"[job] rank {self.renv.rank}: a peer failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True
        )
        if self._restarts_so_far("peer_failure") >= self.cfg.launcher.max_restarts:
            return Outcome(
                K.OUTCOME_FAILED,
                K.REASON_CRASH,
                f"workers failed more than {self.cfg.launcher.max_restarts} times",
            )
        kill = read_kill_record(self.point_dir)
        tags = trainer.checkpoints.tags()
        record = StopRecord(
            reason="peer_failure",
            signal_time=float(kill["time"]) if kill else time.time(),
            exit_time=0.0,
            stop_step=trainer.result.end_step,
            saved_step=step_of(tags[0]) if tags else 0,
            trigger=f"rank {kill['rank']} killed" if kill else type(exc).__name__,
        )
        rec = attempt_record(self, trainer, trainer.result)
        rec["stop"] = record.reason
        append_attempt(self.point_dir, rec)
        self._leave(record, requeue=True, write_attempt=False)

    def _leave(self, record: StopRecord, requeue: bool, write_attempt: bool = True) -> NoReturn:
        """End this attempt: stop record for the next one's restart time, then requeue."""
        if write_attempt and self.renv.is_main:
            from pipeline.accounting import prior_attempts

            attempts = prior_attempts(self.point_dir)
            if attempts:
                attempts[-1]["stop"] = record.reason
                _write_json(self.point_dir / "attempts.json", attempts)
        self.tracker.set_tags({K.TAG_OUTCOME: K.OUTCOME_RUNNING, "sq.last_stop": record.reason})
        self.tracker.close(terminate=False)  # the next attempt logs into the same run
        record.exit_time = time.time()
        write_stop_record(self.point_dir, record)
        print(
            f"[job] rank {self.renv.rank}: {record.reason} at step {record.stop_step}: "
            f"{'requeueing' if requeue else 'leaving it to Slurm'}",
            flush=True,
        )
        if requeue and (self.renv.is_main or record.reason == "peer_failure"):
            requeue_and_exit(self.renv)
        os._exit(0)

    def _log_identity(self) -> None:
        cfg, renv = self.cfg, self.renv
        if not renv.is_main:
            return
        from omegaconf import OmegaConf

        self.tracker.log_params(flatten(OmegaConf.to_container(OmegaConf.create(self.spec.config_yaml))))  # type: ignore[arg-type]
        slurm = {
            K.TAG_SLURM_JOB_ID: _slurm_job_id(),
            K.TAG_SLURM_ARRAY_TASK_ID: os.environ.get("SLURM_ARRAY_TASK_ID", ""),
            K.TAG_SLURM_NODELIST: os.environ.get("SLURM_JOB_NODELIST", ""),
            K.TAG_SLURM_PARTITION: os.environ.get("SLURM_JOB_PARTITION", ""),
            K.TAG_SLURM_NODENAME: os.environ.get("SLURMD_NODENAME", ""),
            K.TAG_SLURM_GPUS: os.environ.get("SLURM_JOB_GPUS", os.environ.get("CUDA_VISIBLE_DEVICES", "")),
            K.TAG_SLURM_GRES: os.environ.get("SLURM_JOB_GRES", os.environ.get("SQ_GRES", "")),
            K.TAG_RESTARTS: os.environ.get("SLURM_RESTART_COUNT", "0"),
        }
        self.tracker.set_tags(
            {
                K.TAG_PARENT_KIND: "point",
                K.TAG_SWEEP_ID: self.spec.sweep_id,
                K.TAG_POINT_ID: self.spec.point_id,
                K.TAG_CANDIDATE: candidate_name(cfg),
                K.TAG_PARTITION: cfg.partition.name,
                K.TAG_GPU_TYPE: cfg.partition.gpu_type,
                K.TAG_MODEL: cfg.model.name,
                K.TAG_PRECISION: cfg.precision.name,
                K.TAG_PARALLELISM: cfg.parallelism.name,
                K.TAG_DRILLS: drill_label(cfg),
                K.TAG_OUTCOME: K.OUTCOME_RUNNING,
                K.TAG_HOST: socket.gethostname(),
                K.TAG_GIT_SHA: git_sha(),
                K.TAG_VERSIONS: versions(),
                K.TAG_LAUNCHER: self.spec.launcher,
                K.TAG_GPUS: renv.world_size,
                K.TAG_PRICE_DATE: cfg.partition.price_date,
                K.TAG_PRICE_SOURCE: cfg.partition.price_source,
                K.TAG_PEAK_SOURCE: cfg.partition.peak_source,
                **{k: v for k, v in slurm.items() if v},
            }
        )
        config_path = self.point_dir / K.ARTIFACT_CONFIG
        config_path.write_text(self.spec.config_yaml)
        self.tracker.log_artifact(config_path)

    def _train(self) -> Outcome:
        from pipeline.runner import execute

        return execute(self)


def _slurm_job_id() -> str:
    """The id the sweep manifest knows: 55_2 for task 2 of array 55 (Slurm gives it its own id)."""
    env = os.environ
    if "SLURM_ARRAY_JOB_ID" in env and "SLURM_ARRAY_TASK_ID" in env:
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "")


def _job_log_path() -> Path | None:
    """The rank's stdout file that submitit (or Slurm) captures: the job log artifact."""
    try:
        import submitit

        env = submitit.JobEnvironment()
        return Path(env.paths.stdout) if Path(env.paths.stdout).exists() else None
    except Exception:
        return None


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def install_stop_handlers(stop: Any, signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)) -> None:
    """A handler only sets the flag; the ranks act on it at the next step boundary."""

    def handler(signum: int, frame: Any) -> None:
        stop.set(signal.Signals(signum).name)

    for sig in signals:
        signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.job spec.json` on every rank, for ranks started by srun or by hand
    (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or SLURM_PROCID/SLURM_NTASKS, in the env)."""
    import sys

    from pipeline.distributed import rank_env_from_environ

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m pipeline.job SPEC.json", file=sys.stderr)
        return 2
    spec = JobSpec(**json.loads(Path(argv[0]).read_text()))
    summary = run_point(spec, rank_env_from_environ())
    return 0 if summary["outcome"] == K.OUTCOME_ACCEPTED else 1


if __name__ == "__main__":
    raise SystemExit(main())
