"""The states and records of an attempt, each named once: why an attempt stopped
(`StopReason`), which run it was in (`Phase`), the stop record one rank writes before it exits
(`StopRecord`, read back by the next attempt), what an attempt left on record for the drills'
evidence (`AttemptFacts`, read from attempts.json), the attempt's whole record in attempts.json
(`AttemptRecord`) and what a killed rank wrote (`KillRecord`).
Pure: no torch, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
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


@dataclass
class AttemptRecord:
    """One attempt's record in attempts.json (one per allocation, appended by the rank that ends
    it). Written in parts: its times (`pipeline.contract.accounting.attempt_record`), its energy and
    failed nodes (`Observer.with_record`), the stop (`StopRecord.attempt_facts`), Slurm's restart
    count and the outcome (`pipeline.job.entry`), `qualify resume`'s mark. A field that was not
    measured is None and absent from the file; keys it does not know are kept (`extra`)."""

    start: float | None = None
    """The attempt's process start, wall clock."""
    end: float | None = None
    """When it ended (its stop, or its outcome), wall clock."""
    allocated_s: float | None = None
    """end - start: the attempt's process clock (the bill when sacct has no record)."""
    ranks: int | None = None
    """Its ranks (one GPU each)."""
    start_step: int | None = None
    """The step its run started after (written with loaded_step and fallbacks, once it trained)."""
    loaded_step: int | None = None
    """The checkpoint it loaded; null: none (written whenever start_step is)."""
    fallbacks: int | None = None
    """Newer checkpoints skipped on load."""
    productive_s: float | None = None
    """Its step times summed (absent: it never had a trainer)."""
    startup_s: float | None = None
    save_s: float | None = None
    """What the loop waited for the saves."""
    load_s: float | None = None
    drills_s: float | None = None
    """A drill's uninterrupted reference run."""
    lost_s: float | None = None
    """Work done again after a restart (the steps past the resumed checkpoint)."""
    saves: int | None = None
    saved_bytes: int | None = None
    verified: int | None = None
    end_step: int | None = None
    gpu_energy_j: float | None = None
    gpus_metered: int | None = None
    host_energy_j: float | None = None
    energy_window_s: float | None = None
    unhealthy_nodes: list[str] | None = None
    """The nodes that failed the health gate."""
    slurm_restarts: int | None = None
    """SLURM_RESTART_COUNT of the allocation; absent off Slurm."""
    stop: str | None = None
    """A StopReason: why it stopped to be resumed (the fields to failed_after_s come with it)."""
    phase: str | None = None
    signal: str | None = None
    stop_step: int | None = None
    saved_step: int | None = None
    drill_fired: bool | None = None
    failed_after_s: float | None = None
    outcome: str | None = None
    """The point's outcome, on the attempt that ended it."""
    needed_person: bool | None = None
    resubmitted: bool | None = None
    """`qualify resume` submitted the point again after this attempt."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys of the file this version does not know, kept as they were."""

    @classmethod
    def from_json(cls, rec: Mapping[str, Any]) -> AttemptRecord:
        """From one attempts.json entry, as any version wrote it."""
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(
            **{k: v for k, v in rec.items() if k in known},
            extra={k: v for k, v in rec.items() if k not in known},
        )

    @classmethod
    def read_all(cls, entries: list[Any]) -> list[AttemptRecord]:
        """attempts.json's list (PointDir.attempts()); an entry that is not an object is skipped."""
        return [cls.from_json(e) for e in entries if isinstance(e, Mapping)]

    def to_json(self) -> dict[str, Any]:
        """The attempts.json entry: the fields that hold a value (loaded_step also when null,
        beside start_step) and the extra keys."""
        out = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "extra"
            and (
                getattr(self, f.name) is not None or (f.name == "loaded_step" and self.start_step is not None)
            )
        }
        return {**out, **self.extra}

    def facts(self, index: int) -> AttemptFacts:
        """What the drills' evidence reads of it (this attempt being attempt `index`)."""
        return AttemptFacts.from_record(index, self.to_json())


@dataclass(frozen=True)
class KillRecord:
    """What the killed rank wrote just before it died (PointDir.write_kill)."""

    rank: int
    after_step: int
