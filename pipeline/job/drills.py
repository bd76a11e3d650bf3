"""Failure drills: a real preemption (three Slurm triggers, or a signal on the local executor),
a killed worker, a time limit shorter than the run; the requeue that follows; and the restart
record from which the next attempt measures its restart time (docs/design.md, "Restart
and lost work"). The trainer only sees hooks and a stop flag."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import psutil
from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE  # its controller restarts the tasks

from pipeline.config.schema import DrillConfig
from pipeline.job.distributed import RankEnv
from pipeline.job.pointdir import PointDir
from pipeline.slurm import commands as slurm
from pipeline.slurm.job import SlurmJob

# A drill's own Slurm calls (the trigger, the requeue) wait long: measured here under a load
# average of 26 on 2 cores, scancel took over 30 s to answer and its signal still arrived
SLURM_TIMEOUT_S = 120
WAIT_FOR_SIGNAL_S = 120  # a preempt drill waits this long at its step for the signal to arrive
CLOCK_SKEW_WARN_S = 1.0  # restart parts across hosts: warn when clocks disagree by more than this


@dataclass
class StopRecord:
    """Why and when an attempt stopped, written by one rank (`writer_rank`) just before it exits."""

    reason: str  # preempt | timeout | peer_failure
    signal_time: float  # the signal (or the kill) that started it, wall clock
    exit_time: float  # this attempt's rank 0 about to exit
    stop_step: int  # the last step this attempt finished
    saved_step: int  # the checkpoint the next attempt should resume from
    trigger: str = ""
    attempt: int = 0
    phase: str = "train"  # train | reference: which run the attempt was in when it stopped
    dead_rank: int | None = None  # peer_failure: the rank that died, when it is known
    detected_time: float = 0.0  # peer_failure: when the survivors' collective failed, wall clock
    drill_fired: bool = False  # the preempt drill's trigger fired in this attempt (rank 0's word)

    @property
    def writer_rank(self) -> int:
        """The rank that records the stop: rank 0, or rank 1 when rank 0 is the one that died."""
        return 1 if self.dead_rank == 0 else 0


@dataclass
class RestartBreakdown:
    """signal -> first optimizer step after resume, in parts that add up to the total."""

    signal_to_exit_s: float
    exit_to_start_s: float
    start_to_ready_s: float
    load_s: float
    first_step_s: float
    lost_steps: int
    reason: str

    @property
    def total_s(self) -> float:
        return (
            self.signal_to_exit_s
            + self.exit_to_start_s
            + self.start_to_ready_s
            + self.load_s
            + self.first_step_s
        )


def breakdown(
    prev: StopRecord, process_start: float, timeline: dict[str, float], resumed_step: int
) -> RestartBreakdown:
    """Split the restart after `prev` at the marks this attempt recorded. The first two parts
    subtract wall clocks of different hosts (the signal or kill, the previous attempt's exit,
    this process's start): a part below 0 is clamped at 0, with a warning when the clocks
    disagree by more than CLOCK_SKEW_WARN_S."""
    parts = {
        "signal_to_exit_s": prev.exit_time - prev.signal_time,
        "exit_to_start_s": process_start - prev.exit_time,
        "start_to_ready_s": timeline["engine_ready"] - process_start,
        "load_s": timeline["load_done"] - timeline["engine_ready"],
        "first_step_s": timeline["first_step_done"] - timeline["load_done"],
    }
    for name, value in parts.items():
        if value < -CLOCK_SKEW_WARN_S:
            print(
                f"[job] restart/{name} is {value:.2f} s: the clocks of the hosts disagree by more than "
                f"{CLOCK_SKEW_WARN_S:.0f} s; the part is counted as 0",
                flush=True,
            )
        parts[name] = max(0.0, value)
    return RestartBreakdown(**parts, lost_steps=max(0, prev.stop_step - resumed_step), reason=prev.reason)


def read_stop_record(point: PointDir) -> StopRecord | None:
    data = point.read_stop()
    return StopRecord(**data) if data else None


def write_stop_record(point: PointDir, record: StopRecord) -> None:
    point.write_stop(asdict(record))


class DrillError(Exception):
    """A drill could not do its part (its trigger failed): the point's drill failed, with this
    message; never a crash of the candidate, and no recovery labor (docs/design.md, "Cost")."""


def trigger_preemption(trigger: str, job: SlurmJob | None) -> str:
    """Preempt this very job, for real; returns what was done (logged). `job`: this job's own
    Slurm identity (pipeline.slurm.job.this_job), None for a point of a local sweep, which is
    signalled locally whatever SLURM_JOB_ID says."""
    if trigger == "local" or job is None:
        # the local executor's tasks are the children of its controller: signal them all,
        # the way submitit's controller forwards a timeout warning
        parent = psutil.Process(os.getppid())
        tasks = [p for p in parent.children() if p.pid != parent.pid]
        for p in tasks:
            p.send_signal(signal.SIGUSR2)
        instead = (
            f" (trigger '{trigger}' needs a Slurm job of this sweep: sent locally)"
            if trigger != "local"
            else ""
        )
        return f"SIGUSR2 to the {len(tasks)} local task(s){instead}"
    if trigger == "signal":
        # what a scheduler's warning sends; --full so the batch shell gets it too (it traps it)
        slurm.signal_job(job.job_id, "USR2", SLURM_TIMEOUT_S)
        return f"scancel --signal=USR2 --full {job.job_id}"
    if trigger == "requeue":
        slurm.requeue(job.job_id, SLURM_TIMEOUT_S)
        return f"scontrol requeue {job.job_id}"
    if trigger == "urgent":
        nodes = slurm.hostnames(job.nodelist, SLURM_TIMEOUT_S)
        if not nodes:
            raise DrillError(f"Slurm did not expand the job's node list {job.nodelist!r}")
        out = slurm.submit_wrap(
            [
                "--partition=urgent",
                f"--nodelist={nodes[0]}",
                "--exclusive",
                "--time=1",
                f"--job-name=sq-urgent-{job.job_id}",
                "--output=/dev/null",
            ],
            "sleep 3",
            SLURM_TIMEOUT_S,
        )
        return f"urgent job {out} on {nodes[0]} (partition priority preempts {job.job_id})"
    raise ValueError(f"unknown preempt trigger {trigger!r}")


class PreemptDrill:
    """After `at_step` on the first attempt, rank 0 preempts the job; the stop flag, set by
    the signal that follows, makes every rank save at a step boundary. A trigger that fails is
    the drill's failure: the ranks agree on it in one collective and all raise DrillError."""

    def __init__(
        self,
        cfg: DrillConfig,
        renv: RankEnv,
        first_attempt: bool,
        job: SlurmJob | None,
        trigger: Callable[[str, SlurmJob | None], str] = trigger_preemption,
    ) -> None:
        self.at_step, self.trigger, self.renv, self.job = cfg.preempt.at_step, cfg.preempt.trigger, renv, job
        self.armed = first_attempt
        self.done = ""
        self._trigger = trigger

    def after_step(self, trainer: Any, step: int) -> None:
        if not (self.armed and step == self.at_step):
            return
        self.armed = False
        error = ""
        if self.renv.is_main:
            try:
                self.done = self._trigger(self.trigger, self.job)
                print(f"[drill] preempt at step {step}: {self.done}", flush=True)
            except slurm.SlurmTimeout as e:  # the request may still take effect: wait for its signal
                self.done = f"{self.trigger} (Slurm answered late: {e})"
                print(f"[drill] preempt at step {step}: {e}; waiting for the signal all the same", flush=True)
            except Exception as e:  # the drill's own failure, not the candidate's
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                print(f"[drill] preempt at step {step}: the trigger failed: {error}", flush=True)
        if not trainer.comm.all_ok(not error):
            raise DrillError(
                f"preempt drill: its trigger '{self.trigger}' failed at step {step}"
                + (f": {error}" if error else " on rank 0")
            )
        # wait here for the signal (the scheduler takes a moment to deliver it), so that the
        # drill does not race a short run to its end; bounded, and every rank waits alike
        deadline = time.time() + WAIT_FOR_SIGNAL_S
        while not trainer.stop.is_set() and time.time() < deadline:
            time.sleep(0.05)


class KillWorkerDrill:
    """After `at_step` on the first attempt, the chosen rank SIGKILLs itself part-way into the
    next step (a timer, so it lands mid-step), after writing when and where it died."""

    def __init__(self, cfg: DrillConfig, renv: RankEnv, point: PointDir, first_attempt: bool) -> None:
        self.at_step, self.rank, self.renv, self.point = (
            cfg.kill_worker.at_step,
            cfg.kill_worker.rank,
            renv,
            point,
        )
        self.armed = first_attempt and renv.rank == cfg.kill_worker.rank

    def after_step(self, trainer: Any, step: int) -> None:
        if not (self.armed and step == self.at_step):
            return
        self.armed = False
        times = list(trainer.result.step_times.values())
        delay = 0.5 * sorted(times)[len(times) // 2] if times else 0.01

        def kill() -> None:
            record = {"time": time.time(), "after_step": step, "rank": self.renv.rank, "pid": os.getpid()}
            self.point.write_kill(record)
            print(f"[drill] kill_worker: SIGKILL rank {self.renv.rank} during step {step + 1}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(delay, kill).start()


def is_peer_failure(exc: BaseException) -> bool:
    """A collective failed because another rank is gone (gloo, NCCL, or the timeout)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    needles = (
        "connection closed by peer",
        "connection reset",
        "broken pipe",
        "nccl",
        "timed out",
        "timeout",
        "gloo",
    )
    return type(exc).__name__ in ("DistBackendError", "DistNetworkError") or any(n in text for n in needles)


def requeue_and_exit(job: SlurmJob | None) -> None:
    """Requeue this job and leave without a result, so submitit (or Slurm) runs it again.

    On Slurm, `scontrol requeue` of this job's own id (submitit's own way); on the local
    executor, the exit code its controller reads as 'start the tasks again'. Ranks other than
    the caller just exit."""
    sys.stdout.flush()
    if job is not None:
        try:
            slurm.requeue(job.job_id, SLURM_TIMEOUT_S)
        except slurm.SlurmCommandError as e:  # already being requeued by Slurm
            print(f"[drill] {e}", flush=True)
        os._exit(1)
    if os.environ.get("SUBMITIT_LOCAL_JOB_ID"):
        os._exit(LOCAL_REQUEUE_RETURN_CODE)
    os._exit(3)  # started by hand: the caller starts it again


@dataclass
class DrillVerdict:
    ok: bool
    detail: str = ""
