"""drill=timeout: a time limit shorter than the run (the job's own limit, set at submission);
the warning signal before it makes every rank save, the job is requeued and resumes.

Its run may be paced (`step_floor_s`): what the drill tests is the warning, the save, the
requeue and the resume, none of which depends on the work done between them. On cores shared
with other work (CI's 2 cores, a login node) a run that lasts past a minutes-long limit would
otherwise hold every core it has for minutes; paced, its ranks sleep between steps. The sleep
is outside every step's time (perf/* measure the steps as trained) and counted in the attempt's
time/drills_s; the reference run is never paced."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config.checks import number as _number
from pipeline.config.checks import require as _require
from pipeline.contract.records import StopReason
from pipeline.drills.base import DrillSpec

if TYPE_CHECKING:
    from pipeline.job.attempt import AttemptContext

MAX_STEP_FLOOR_S = 60.0


@dataclass
class TimeoutDrillConfig:
    enabled: bool = False
    """A time limit shorter than the run; save on the warning signal and requeue."""
    time_limit_min: int = 2
    """The attempt's wall-time limit, minutes, >= 1."""
    signal_delay_s: int = 60
    """The warning (USR2) comes this long before the limit, seconds, >= 1 and under the limit."""
    step_floor_s: float = 0.0
    """The drilled run's steps start at least this many seconds apart, its ranks sleeping out the
    rest (0: as fast as they train), in [0, 60]: a run that outlasts the limit without holding
    every core (the sleep counts in time/drills_s, never in a step's time)."""

    def __post_init__(self) -> None:
        _require(
            self.time_limit_min >= 1, "drill.timeout.time_limit_min", self.time_limit_min, "an integer >= 1"
        )
        _require(
            1 <= self.signal_delay_s < self.time_limit_min * 60,
            "drill.timeout.signal_delay_s",
            self.signal_delay_s,
            f"an integer >= 1 and below drill.timeout.time_limit_min x 60 = {self.time_limit_min * 60} s",
        )
        _number("drill.timeout.step_floor_s", self.step_floor_s, 0.0, MAX_STEP_FLOOR_S)


def time_limit(cfg: Any) -> tuple[int, int]:
    """The job's time limit under this drill, minutes, and its warning, seconds before it."""
    return cfg.timeout.time_limit_min, cfg.timeout.signal_delay_s


def step_floor(cfg: Any) -> float:
    return float(cfg.timeout.step_floor_s)


class StepFloor:
    """After each step, sleep until `floor_s` after that step began (when this hook last returned;
    the attempt's first step is not held back); a stop flag set meanwhile ends the sleep at once.
    Each rank sleeps on its own clock, and the next step's collectives line them up again. The
    seconds slept go to the attempt's timeline (Mark.PACED_S: its drills_s)."""

    def __init__(self, floor_s: float) -> None:
        self.floor_s = floor_s
        self._last: float | None = None

    def after_step(self, trainer: Any, step: int) -> None:
        from pipeline.measure.timeline import Mark

        now = time.perf_counter()
        if self._last is not None and (wait := self._last + self.floor_s - now) > 0:
            trainer.stop.wait(wait)
            timeline = trainer.result.timeline
            timeline[Mark.PACED_S] = timeline.get(Mark.PACED_S, 0.0) + time.perf_counter() - now
        self._last = time.perf_counter()


def hook(ctx: AttemptContext) -> StepFloor | None:
    floor = ctx.cfg.drill.timeout.step_floor_s
    return StepFloor(floor) if ctx.cfg.drill.timeout.enabled and floor > 0 else None


SPEC = DrillSpec(
    name="timeout",
    order=40,
    summary="a time limit shorter than the run: save on the warning signal, requeue, resume",
    options=TimeoutDrillConfig,
    doc="Time-out drill.",
    stops=(StopReason.TIMEOUT,),
    stopped_by="the time-limit warning",
    reference=True,
    hook=hook,
    step_floor=step_floor,
    time_limit=time_limit,
)
