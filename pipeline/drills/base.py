"""A drill's declaration (`DrillSpec`): what the config, the estimate and the job's registry
read of it; each module of pipeline.drills declares one."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.contract.records import StopReason


@dataclass(frozen=True)
class DrillSpec:
    """One drill's declaration (one module per drill in this package, `SPEC`)."""

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

    @property
    def interrupting(self) -> bool:
        """It stops the job, which must resume."""
        return bool(self.stops)

    @property
    def restarts(self) -> bool:
        """Its point starts ranks once more: it interrupts the run, or resumes it on other ranks
        (the estimate charges one start-up, and the reference replay)."""
        return self.interrupting or self.resumes_ranks
