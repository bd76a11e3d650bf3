"""Every drill as the whole project knows it before any rank runs, one module each: its name,
its summary, its options (the config's `drill.<name>` section), whether it stops the run (its
stop reasons), whether it starts ranks again, whether a reference run follows. Torch-free: the
config's schema builds `DrillConfig`'s sections from it, the estimate counts restarts from it,
and the job's registry (pipeline.job.drills) adds each drill's runtime part (its step hook, its
evidence, its verify) by name.

Adding a drill: its module here (a `DrillSpec` named `SPEC`, with its options dataclass), its
runtime module in pipeline/job/drills/ when it has a hook or a check of its own, its
`conf/drill/<name>.yaml`, and its test; nothing else lists it (tests/unit/test_drill_registry.py
counts the files). The modules of this package are found by `discover`, not by a list.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import
`config.checks`, `contract.records`; of libraries only the standard library.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from pipeline.drills.base import DrillSpec

__all__ = ["BY_NAME", "SPECS", "DrillSpec", "discover", "enabled", "interrupting", "restarting"]


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


def restarting(cfg: Any) -> list[str]:
    """The enabled drills that start ranks again (interrupting ones, and reshape)."""
    return [s.name for s in enabled(cfg) if s.restarts]
