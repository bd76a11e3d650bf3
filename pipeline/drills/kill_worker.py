"""drill=kill_worker: after a step of the first attempt, the chosen rank SIGKILLs itself part-way
into the next step; the survivors' collectives fail within the process-group timeout, the job is
requeued and resumes from the last interval checkpoint saved before the kill."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config.checks import require as _require
from pipeline.contract.records import AttemptFacts, KillRecord, StopReason
from pipeline.drills.base import DrillSpec

if TYPE_CHECKING:
    from pipeline.config.schema import DrillConfig
    from pipeline.contract.pointdir import PointDir
    from pipeline.job.attempt import AttemptContext
    from pipeline.job.distributed import RankEnv

log = logging.getLogger("pipeline.drill")  # the job log's `[drill] ...` lines


@dataclass
class KillWorkerDrillConfig:
    enabled: bool = False
    """SIGKILL one rank mid-run; the job fails, requeues and resumes (needs train.checkpoint_interval > 0)."""
    at_step: int = 10
    """After this optimizer step the chosen rank dies during the next one, in [1, train.steps)."""
    rank: int = 1
    """Which rank is killed, in [0, ranks of the run)."""

    def __post_init__(self) -> None:
        _require(self.at_step >= 1, "drill.kill_worker.at_step", self.at_step, "an integer >= 1")
        _require(self.rank >= 0, "drill.kill_worker.rank", self.rank, "an integer >= 0")


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


def hook(ctx: AttemptContext) -> KillWorkerDrill | None:
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


SPEC = DrillSpec(
    name="kill_worker",
    order=30,
    summary="SIGKILL one rank mid-step: the others fail fast, the job requeues and resumes",
    options=KillWorkerDrillConfig,
    doc="Killed-worker drill.",
    stops=(StopReason.PEER_FAILURE,),
    stopped_by="the survivors of the killed rank",
    reference=True,
    hook=hook,
    before_stop=killed,
    at_stop=survivors,
)
