"""drill=kill_worker: one rank SIGKILLs itself mid-step; the others fail fast on the broken
collective, the job requeues and resumes from the last checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.checks import require as _require
from pipeline.contract.records import StopReason
from pipeline.drills.base import DrillSpec


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


SPEC = DrillSpec(
    name="kill_worker",
    order=30,
    summary="SIGKILL one rank mid-step: the others fail fast, the job requeues and resumes",
    options=KillWorkerDrillConfig,
    doc="Killed-worker drill.",
    stops=(StopReason.PEER_FAILURE,),
    stopped_by="the survivors of the killed rank",
    reference=True,
)
