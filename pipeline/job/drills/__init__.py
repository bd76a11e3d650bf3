"""The drills as the job runs them, and the one list of them (`DRILLS`) that the rest of the job
reads: the runner's step hooks (`build_hooks`), whether a reference run follows
(`needs_reference`), which drills interrupt the run and what evidence they must show
(pipeline.job.evidence). Each drill is declared in pipeline.drills (its options, its stops);
its runtime part, when it has one, is the module of the same name here, found by its `DRILL`
entry; no list names them (tests/unit/test_drill_registry.py counts a new drill's files)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from pipeline.contract.records import StopRecord
from pipeline.drills import SPECS
from pipeline.drills.base import DrillSpec
from pipeline.job.derived import RestartBreakdown, breakdown  # where they were before the registry
from pipeline.job.drills.base import (
    SLURM_TIMEOUT_S,
    Drill,
    DrillError,
    DrillVerdict,
    is_peer_failure,
    read_stop_record,
    requeue_and_exit,
    write_stop_record,
)
from pipeline.job.drills.kill_worker import KillWorkerDrill
from pipeline.job.drills.preempt import WAIT_FOR_SIGNAL_S, PreemptDrill, trigger_preemption

if TYPE_CHECKING:
    from pipeline.config.schema import DrillConfig
    from pipeline.job.attempt import AttemptContext


def registry(specs: tuple[DrillSpec, ...] = SPECS, package: str = __name__) -> tuple[Drill, ...]:
    """Every declared drill with its runtime part: the `DRILL` of this package's module of the
    same name, or none (no hook, no checks of its own). Other modules here are the drills'
    shared helpers (`reference`), imported where they are used."""
    out = []
    for spec in specs:
        name = f"{package}.{spec.name}"
        runtime = importlib.import_module(name).DRILL if importlib.util.find_spec(name) else None
        if runtime is not None and runtime.spec is not spec:
            raise ValueError(f"{name}.DRILL is not the drill declared as pipeline.drills.{spec.name}")
        out.append(runtime or Drill(spec))
    return tuple(out)


DRILLS: tuple[Drill, ...] = registry()
"""Every drill, in the order they are named in configs and docs."""

BY_NAME = {d.name: d for d in DRILLS}


def enabled(cfg: DrillConfig) -> list[Drill]:
    """The drills this point runs (drill=[checkpoint,preempt] runs both)."""
    return [d for d in DRILLS if getattr(cfg, d.name).enabled]


def interrupting(cfg: DrillConfig) -> list[str]:
    """The enabled drills that stop the job and need a resume."""
    return [d.name for d in enabled(cfg) if d.interrupting]


def needs_reference(cfg: DrillConfig) -> bool:
    """An enabled drill is checked against an uninterrupted reference run (and one is on)."""
    return cfg.reference and any(d.reference for d in enabled(cfg))


def build_hooks(ctx: AttemptContext) -> list[Any]:
    """The step hooks of this attempt's enabled drills, in registry order."""
    hooks = [d.hook(ctx) for d in enabled(ctx.cfg.drill)]
    return [h for h in hooks if h is not None]


__all__ = [
    "BY_NAME",
    "DRILLS",
    "SLURM_TIMEOUT_S",
    "WAIT_FOR_SIGNAL_S",
    "Drill",
    "DrillError",
    "DrillVerdict",
    "KillWorkerDrill",
    "RestartBreakdown",
    "PreemptDrill",
    "StopRecord",
    "breakdown",
    "build_hooks",
    "enabled",
    "interrupting",
    "is_peer_failure",
    "needs_reference",
    "read_stop_record",
    "requeue_and_exit",
    "trigger_preemption",
    "write_stop_record",
]
