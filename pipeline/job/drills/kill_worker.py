"""drill=kill_worker: after a step of the first attempt, the chosen rank SIGKILLs itself part-way
into the next step; the survivors' collectives fail within the process-group timeout, the job is
requeued and resumes from the last interval checkpoint saved before the kill."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from pipeline.config.schema import DrillConfig
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptFacts, KillRecord, StopReason, StopRecord
from pipeline.drills.kill_worker import SPEC
from pipeline.job.distributed import RankEnv
from pipeline.job.drills.base import Drill

if TYPE_CHECKING:
    from pipeline.job.attempt import AttemptContext

log = logging.getLogger("pipeline.drill")  # the job log's `[drill] ...` lines


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
            log.info("kill_worker: SIGKILL rank %d during step %d", self.renv.rank, step + 1)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(delay, kill).start()


def _hook(ctx: AttemptContext) -> KillWorkerDrill | None:
    if not ctx.cfg.drill.kill_worker.enabled:
        return None
    return KillWorkerDrill(ctx.cfg.drill, ctx.renv, ctx.point, ctx.first)


def killed(kill: KillRecord | None, rank: int | None) -> list[str]:
    """The chosen rank's own record of its death."""
    if kill is None:
        return [f"the death of rank {rank} (it left no record of being killed)"]
    if rank is not None and kill.rank != rank:
        return [f"the death of rank {rank} (rank {kill.rank} died instead)"]
    return []


def survivors(stop: AttemptFacts, pg_timeout_s: float | None) -> list[str]:
    """The survivors failed within the process-group timeout, after an interval checkpoint."""
    out = []
    if stop.failed_after_s is None:
        out.append(f"the time the survivors of attempt {stop.index + 1} failed after the kill")
    elif pg_timeout_s is not None and stop.failed_after_s > pg_timeout_s:
        out.append(
            f"the survivors failing within the process-group timeout ({pg_timeout_s:.0f} s): "
            f"they failed {stop.failed_after_s:.0f} s after the kill"
        )
    if not stop.saved_step:
        out.append(
            f"an interval checkpoint before the kill (none was committed by step {stop.stop_step}): "
            "a resume from step 0 proves nothing; set train.checkpoint_interval below the kill step"
        )
    return out


def peer_failure(attempt: Any, exc: BaseException) -> StopRecord:
    """Another rank died mid-step (the kill_worker drill, or a real node failure): the run
    goes on from the last checkpoint in the next attempt. No collective: a peer is gone."""
    from pipeline.train.checkpoint import step_of

    trainer = attempt.trainer
    assert trainer is not None
    log.warning("rank %d: a peer failed: %s: %s", attempt.renv.rank, type(exc).__name__, str(exc)[:300])
    kill = attempt.point.read_kill()
    tags = trainer.checkpoints.tags()
    return StopRecord(
        reason=StopReason.PEER_FAILURE,
        signal_time=float(kill["time"]) if kill else time.time(),
        exit_time=0.0,
        stop_step=trainer.result.end_step,
        saved_step=step_of(tags[0]) if tags else 0,
        trigger=f"rank {kill['rank']} killed" if kill else type(exc).__name__,
        attempt=len(attempt.prior),
        dead_rank=int(kill["rank"]) if kill else None,
        detected_time=time.time(),
    )


DRILL = Drill(
    SPEC,
    hook=_hook,
    before_stop=killed,
    at_stop=survivors,
)
