"""drill=timeout: a time limit shorter than the run (the job's own limit, set at submission);
the warning signal before it makes every rank save, the job is requeued and resumes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.config.checks import require as _require
from pipeline.contract.records import StopReason
from pipeline.drills.base import DrillSpec


@dataclass
class TimeoutDrillConfig:
    enabled: bool = False
    """A time limit shorter than the run; save on the warning signal and requeue."""
    time_limit_min: int = 2
    """The attempt's wall-time limit, minutes, >= 1."""
    signal_delay_s: int = 60
    """The warning (USR2) comes this long before the limit, seconds, >= 1 and under the limit."""

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


def time_limit(cfg: Any) -> tuple[int, int]:
    """The job's time limit under this drill, minutes, and its warning, seconds before it."""
    return cfg.timeout.time_limit_min, cfg.timeout.signal_delay_s


SPEC = DrillSpec(
    name="timeout",
    order=40,
    summary="a time limit shorter than the run: save on the warning signal, requeue, resume",
    options=TimeoutDrillConfig,
    doc="Time-out drill.",
    stops=(StopReason.TIMEOUT,),
    stopped_by="the time-limit warning",
    reference=True,
    time_limit=time_limit,
)
