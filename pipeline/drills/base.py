"""A drill's declaration (`DrillSpec`): what the config, the estimate and the job's registry
read of it, and the functions of its runtime part the job calls; each module of pipeline.drills
declares one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.contract.records import StopReason


@dataclass(frozen=True)
class DrillSpec:
    """One drill (one module per drill in this package, `SPEC`): what it is, and its runtime
    part. The runtime functions run only inside the job, and import the job's code (torch,
    pipeline.job) inside their bodies, so that the login node reads the declaration alone."""

    name: str
    order: int
    """Where it sits among the drills: configs, docs and the sq.drills tag list them in order."""
    summary: str
    """What it does, one line (docs)."""
    options: type
    """Its options: a dataclass with an `enabled` field, the config's `drill.<name>` section."""
    doc: str
    """The section's one-line description in the config."""
    stops: tuple[StopReason, ...] = ()
    """The stop reasons it produces; not empty: it interrupts the run, and passes only on
    evidence of the stop, the save, the requeue and the resume (pipeline.job.evidence)."""
    stopped_by: str = ""
    """The stop it must show, in words: 'a stop of the run by <stopped_by>'."""
    needs_trigger: bool = False
    """Only a stop in an attempt where its own trigger fired counts (a cancel is no drill)."""
    reference: bool = False
    """Its run is compared, step by step, with an uninterrupted reference run."""
    resumes_ranks: bool = False
    """Without stopping the job, it starts ranks again (reshape: the resumed ranks)."""
    hook: Callable[[Any], Any] | None = None
    """Its step hook for an attempt: `hook(ctx)` (pipeline.job.attempt.AttemptContext) gives an
    object with `after_step(trainer, step)`, or None; no hook: the drill acts in no step."""
    before_stop: Callable[[Any, int | None], list[str]] | None = None
    """Evidence it lacks that no attempt record holds: `before_stop(kill, rank)` (a
    contract.records.KillRecord or None, the rank it chose) names what is missing."""
    at_stop: Callable[[Any, float | None], list[str]] | None = None
    """What the first stop must show: `at_stop(facts, pg_timeout_s)` (contract.records.AttemptFacts)
    names what is missing; None: the signal, and a save at that step boundary."""
    step_floor: Callable[[Any], float] | None = None
    """It paces its run: `step_floor(drill_config)` gives the least seconds between the starts
    of two steps of the drilled run (0: none); its hook sleeps out the rest, and the estimate
    charges it."""
    time_limit: Callable[[Any], tuple[int, int]] | None = None
    """It sets the job's time limit instead of the partition's: `time_limit(drill_config)` gives
    (minutes, the warning's seconds before it); the submission asks for it, and a stop under it
    is a time-out (timeout)."""
    hand_over_after: Callable[[Any], int] | None = None
    """It takes the run over after this step (`hand_over_after(drill_config)`): its hook raises
    pipeline.job.drills.HandOver there, and an attempt that resumes at or past it hands over
    at once (reshape: the resumed ranks train the rest)."""
    hand_over: Callable[[Any, Any], Any] | None = None
    """The run handed over: `hand_over(attempt, trainer)` runs the rest and returns its result."""
    verify_hand_over: Callable[[Any, Any, Any], Any] | None = None
    """The verify stage of a handed-over run: `verify_hand_over(attempt, trainer, result)` gives
    a pipeline.job.drills.Verified, or the point's end (contract.spec.PointEnd)."""

    def __post_init__(self) -> None:
        parts = (self.hand_over_after, self.hand_over, self.verify_hand_over)
        if any(parts) and not all(parts):
            raise ValueError(f"drill {self.name}: a hand-over needs its step, its run and its verify")

    @property
    def interrupting(self) -> bool:
        """It stops the job, which must resume."""
        return bool(self.stops)

    @property
    def restarts(self) -> bool:
        """Its point starts ranks once more: it interrupts the run, or resumes it on other ranks
        (the estimate charges one start-up, and the reference replay)."""
        return self.interrupting or self.resumes_ranks
