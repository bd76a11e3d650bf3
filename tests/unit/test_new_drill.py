"""A new drill is its module (pipeline/drills/<name>.py: its options and its `SPEC`), its
runtime part when it has a hook (pipeline/job/drills/<name>.py: its `DRILL`), its
`conf/drill/<name>.yaml` and its test: nothing else lists it. Shown on a copy of the package
with a dummy drill written into it: the schema, the composition, the estimate, the runner's
hooks and what the report names a run by all pick it up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DECLARATION = '''
"""drill=dummy: a drill of the acceptance test."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.drills.base import DrillSpec


@dataclass
class DummyDrillConfig:
    enabled: bool = False
    """Turn the dummy drill on."""
    at_step: int = 3
    """When it does nothing."""


SPEC = DrillSpec(
    name="dummy",
    order=99,
    summary="does nothing, as a test",
    options=DummyDrillConfig,
    doc="The dummy drill.",
    reference=True,
    resumes_ranks=True,
)
'''

RUNTIME = '''
"""The dummy drill's step hook."""

from __future__ import annotations

from typing import Any

from pipeline.drills.dummy import SPEC
from pipeline.job.drills.base import Drill


class DummyHook:
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step


def _hook(ctx: Any) -> DummyHook:
    return DummyHook(ctx.cfg.drill.dummy.at_step)


DRILL = Drill(SPEC, hook=_hook)
'''

CHECK = """
from types import SimpleNamespace

from pipeline.config.compose import compose_sweep
from pipeline.config.keys import all_keys
from pipeline.config.resolved import drill_label
from pipeline.config.schema import DrillConfig
from pipeline.job import drills
from pipeline.submit import estimate as E

assert DrillConfig().dummy.at_step == 3 and "dummy" in DrillConfig().sections()
assert any(k.key == "drill.dummy.at_step" and k.doc == "When it does nothing." for k in all_keys())
(p,) = compose_sweep("default", ["precision=fp32", "parallelism=zero1", "drill=dummy", "drill.dummy.at_step=4"])
assert p.cfg.drill.enabled_names() == ["dummy"] and p.cfg.drill.interrupting() == []
step = E.step_time_s(p.cfg)
wall, _ = E.point_wall_s(p.cfg, local=True)
assert abs(wall - (2 * (15.0 + p.cfg.train.steps * step) + 15.0)) < 1e-9, wall  # a restart, a replay
assert drills.needs_reference(p.cfg.drill)
ctx = SimpleNamespace(cfg=p.cfg, renv=SimpleNamespace(rank=0, is_main=True), first=True, slurm=None)
(hook,) = drills.build_hooks(ctx)
assert type(hook).__name__ == "DummyHook" and hook.at_step == 4
assert drill_label(p.cfg) == "dummy" and p.point_id.endswith("-dummy")  # sq.drills, the run's name
print("ok")
"""


def _copy_with_dummy(root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("pipeline", "conf"):
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "pipeline" / "drills" / "dummy.py").write_text(textwrap.dedent(DECLARATION))
    (root / "pipeline" / "job" / "drills" / "dummy.py").write_text(textwrap.dedent(RUNTIME))
    (root / "conf" / "drill" / "dummy.yaml").write_text("dummy:\n  enabled: true\n")


def _files(root: Path) -> set[str]:
    return {
        str(f.relative_to(root))
        for name in ("pipeline", "conf")
        for f in (root / name).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    }


def test_a_dummy_drill_in_its_own_files_is_picked_up_everywhere(tmp_path: Path) -> None:
    _copy_with_dummy(tmp_path)
    added = _files(tmp_path) - _files(REPO)
    # the docs' count (docs/design.md, "Drills"): these three and this test, no file edited
    assert added == {"pipeline/drills/dummy.py", "pipeline/job/drills/dummy.py", "conf/drill/dummy.yaml"}
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("SQ_CONF_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_copy_without_the_dummy_has_none(tmp_path: Path) -> None:
    from pipeline.config.schema import DrillConfig

    assert "dummy" not in DrillConfig().sections()  # the repository's own package is untouched
