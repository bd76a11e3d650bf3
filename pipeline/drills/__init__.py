"""Every drill, one module each: what the whole project knows of it before any rank runs (its
name, its summary, its options, the config's `drill.<name>` section, whether it stops the run
(its stop reasons), whether it starts ranks again, whether a reference run follows) and its
runtime part (its step hook, its own evidence, a hand-over of the run and its verify), all in
its `SPEC`. The modules import torch-free at their top level: the config's schema builds
`DrillConfig`'s sections from them and the estimate counts restarts from them on the login
node; the runtime functions run only in the job (pipeline.job.drills calls them) and import
the job's code inside their bodies.

Adding a drill: its module here (its options dataclass, its runtime functions, and a
`DrillSpec` named `SPEC`), its `conf/drill/<name>.yaml`, and its test; nothing else lists it
(tests/unit/test_new_drill.py counts the files). The modules of this package are found by
`discover`, not by a list.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import
`config.checks`, `contract.records`; of libraries only the standard library; inside its
functions (and under `if TYPE_CHECKING:`) `job` and what it may import.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from pipeline.drills.base import DrillSpec

__all__ = [
    "BY_NAME",
    "SPECS",
    "DrillSpec",
    "discover",
    "enabled",
    "interrupting",
    "restarting",
    "step_floor_s",
    "time_limit",
]


def discover(package: str = __name__) -> tuple[DrillSpec, ...]:
    """The `SPEC` of every module of `package`, in drill order: a new module is a new drill."""
    paths = importlib.import_module(package).__path__
    modules = [importlib.import_module(f"{package}.{m.name}") for m in pkgutil.iter_modules(paths)]
    specs = sorted((m.SPEC for m in modules if isinstance(getattr(m, "SPEC", None), DrillSpec)), key=_order)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"two drills share a name: {names}")
    return tuple(specs)


def _order(spec: DrillSpec) -> tuple[int, str]:
    return spec.order, spec.name


SPECS: tuple[DrillSpec, ...] = discover()
"""Every drill, in the order they are named in configs and docs."""

BY_NAME = {s.name: s for s in SPECS}


def enabled(cfg: Any) -> list[DrillSpec]:
    """The drills a point's drill section (config.schema.DrillConfig) turns on, in order."""
    return [s for s in SPECS if getattr(cfg, s.name).enabled]


def interrupting(cfg: Any) -> list[str]:
    """The enabled drills that stop the job and need a resume."""
    return [s.name for s in enabled(cfg) if s.interrupting]


def time_limit(cfg: Any) -> tuple[int, int] | None:
    """The time limit an enabled drill sets for the job instead of the partition's (minutes, and
    the warning's seconds before it), or None."""
    return next((s.time_limit(cfg) for s in enabled(cfg) if s.time_limit is not None), None)


def step_floor_s(cfg: Any) -> float:
    """The least seconds a step of the drilled run takes under the enabled drills' pace (0: none);
    the reference run is never paced."""
    return max((s.step_floor(cfg) for s in enabled(cfg) if s.step_floor is not None), default=0.0)


def restarting(cfg: Any) -> list[str]:
    """The enabled drills that start ranks again (interrupting ones, and reshape)."""
    return [s.name for s in enabled(cfg) if s.restarts]
