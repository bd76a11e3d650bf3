"""The states and records of an attempt, each named once: why an attempt stopped
(`StopReason`), which run it was in (`Phase`), the stop record one rank writes before it exits
(`StopRecord`, read back by the next attempt), what an attempt left on record for the drills'
evidence (`AttemptFacts`, read from attempts.json) and what a killed rank wrote (`KillRecord`).
Pure: no torch, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class StopReason(StrEnum):
    """Why an attempt stopped to be resumed (attempts.json `stop`, StopRecord.reason)."""

    PREEMPT = "preempt"
    """SIGUSR2 from the scheduler's warning, away from the time limit (or the preempt drill)."""
    TERMINATED = "terminated"
    """SIGTERM: scancel, scontrol requeue; Slurm decides what follows."""
    TIMEOUT = "timeout"
    """SIGUSR2 near the time limit, or under the timeout drill."""
    PEER_FAILURE = "peer_failure"
    """Another rank died mid-step (the kill_worker drill, or a real node failure)."""


class Phase(StrEnum):
    """Which run an attempt was in when it stopped."""

    TRAIN = "train"
    REFERENCE = "reference"  # a drill's uninterrupted reference run


@dataclass
class StopRecord:
    """Why and when an attempt stopped, written by one rank (`writer_rank`) just before it exits."""

    reason: str  # a StopReason
    signal_time: float  # the signal (or the kill) that started it, wall clock
    exit_time: float  # this attempt's rank 0 about to exit
    stop_step: int  # the last step this attempt finished
    saved_step: int  # the checkpoint the next attempt should resume from
    trigger: str = ""
    attempt: int = 0
    phase: str = Phase.TRAIN  # a Phase
    dead_rank: int | None = None  # peer_failure: the rank that died, when it is known
    detected_time: float = 0.0  # peer_failure: when the survivors' collective failed, wall clock
    drill_fired: bool = False  # the preempt drill's trigger fired in this attempt (rank 0's word)

    def __post_init__(self) -> None:
        self.reason = StopReason(self.reason).value  # a misspelt reason fails here, not in the evidence
        self.phase = Phase(self.phase).value

    @property
    def writer_rank(self) -> int:
        """The rank that records the stop: rank 0, or rank 1 when rank 0 is the one that died."""
        return 1 if self.dead_rank == 0 else 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def attempt_facts(self) -> dict[str, Any]:
        """What the stop adds to its attempt's record in attempts.json (the evidence reads it:
        pipeline.job.evidence.AttemptFacts)."""
        facts: dict[str, Any] = {
            "stop": self.reason,
            "phase": self.phase,
            "signal": self.trigger,
            "stop_step": self.stop_step,
            "saved_step": self.saved_step,
            "drill_fired": self.drill_fired,
        }
        if self.reason == StopReason.PEER_FAILURE and self.detected_time:
            facts["failed_after_s"] = self.detected_time - self.signal_time
        return facts


@dataclass(frozen=True)
class AttemptFacts:
    """What one attempt left on record that the evidence reads."""

    index: int
    start_step: int = 0
    """The step the attempt's run started after: the loaded checkpoint's, else 0."""
    loaded_step: int | None = None
    """The run's checkpoint the attempt loaded; None: it loaded none."""
    fallbacks: int = 0
    """Newer checkpoints skipped on load because they did not check out."""
    slurm_restarts: int | None = None
    """SLURM_RESTART_COUNT of the allocation; None off Slurm."""
    stop: str = ""
    """Why it stopped to be resumed (preempt, terminated, timeout, peer_failure); "" if it ended."""
    phase: str = "train"
    """train | reference: which run it was in when it stopped."""
    signal: str = ""
    """The signal that stopped it (or what failed, for a peer failure)."""
    stop_step: int | None = None
    """The last step it finished."""
    saved_step: int | None = None
    """The newest checkpoint committed when it stopped (0: none)."""
    failed_after_s: float | None = None
    """peer_failure: seconds from the kill to the survivors' failed collective."""
    drill_fired: bool = False
    """The preempt drill's trigger fired in this attempt (a cancel's SIGTERM is no drill)."""
    resubmitted: bool = False
    """`qualify resume` submitted the point again after this attempt (a new job, not a requeue)."""

    @classmethod
    def from_record(cls, index: int, rec: Mapping[str, Any]) -> AttemptFacts:
        """From an attempts.json record (keys written by pipeline.job.entry)."""

        def num(key: str) -> Any:
            value = rec.get(key)
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None

        return cls(
            index=index,
            start_step=int(num("start_step") or 0),
            loaded_step=None if num("loaded_step") is None else int(num("loaded_step")),
            fallbacks=int(num("fallbacks") or 0),
            slurm_restarts=None if num("slurm_restarts") is None else int(num("slurm_restarts")),
            stop=str(rec.get("stop") or ""),
            phase=str(rec.get("phase") or "train"),
            signal=str(rec.get("signal") or ""),
            stop_step=None if num("stop_step") is None else int(num("stop_step")),
            saved_step=None if num("saved_step") is None else int(num("saved_step")),
            failed_after_s=num("failed_after_s"),
            drill_fired=bool(rec.get("drill_fired")),
            resubmitted=bool(rec.get("resubmitted")),
        )


@dataclass(frozen=True)
class KillRecord:
    """What the killed rank wrote just before it died (PointDir.write_kill)."""

    rank: int
    after_step: int
