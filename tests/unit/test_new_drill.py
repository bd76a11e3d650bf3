"""A new drill is its module (pipeline/drills/<name>.py: its options, its runtime part and its
`SPEC`), its `conf/drill/<name>.yaml` and its test: nothing else lists it. Shown on a copy of the
package with a dummy drill written into it: the schema, the composition, the estimate, the
runner's hooks and the report all pick it up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

MODULE = '''
"""drill=dummy: a drill of the acceptance test."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.drills.base import DrillSpec


@dataclass
class DummyDrillConfig:
    enabled: bool = False
    """Turn the dummy drill on."""
    at_step: int = 3
    """When it does nothing."""


class DummyHook:
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def after_step(self, trainer: Any, step: int) -> None:
        pass


def hook(ctx: Any) -> DummyHook:
    from pipeline.job.drills.base import Drill  # the job's code: only inside the job

    assert Drill
    return DummyHook(ctx.cfg.drill.dummy.at_step)


SPEC = DrillSpec(
    name="dummy",
    order=99,
    summary="does nothing, as a test",
    options=DummyDrillConfig,
    doc="The dummy drill.",
    reference=True,
    resumes_ranks=True,
    hook=hook,
)
'''

CHECK = """
import sys
from types import SimpleNamespace

from pipeline.config.compose import compose_sweep
from pipeline.config.keys import all_keys
from pipeline.config.resolved import candidate_name, drill_label
from pipeline.config.schema import DrillConfig
from pipeline.submit import estimate as E
from pipeline.tracking import keys as K

# the login node: the schema, the composition and the estimate read the module, torch-free
assert DrillConfig().dummy.at_step == 3 and "dummy" in DrillConfig().sections()
assert any(k.key == "drill.dummy.at_step" and k.doc == "When it does nothing." for k in all_keys())
(p,) = compose_sweep("default", ["precision=fp32", "parallelism=zero1", "drill=dummy", "drill.dummy.at_step=4"])
(plain,) = compose_sweep("default", ["precision=fp32", "parallelism=zero1", "drill=none"])
assert p.cfg.drill.enabled_names() == ["dummy"] and p.cfg.drill.interrupting() == []
step = E.step_time_s(p.cfg)
wall, _ = E.point_wall_s(p.cfg, local=True)
assert abs(wall - (2 * (15.0 + p.cfg.train.steps * step) + 15.0)) < 1e-9, wall  # a restart, a replay
assert not {"torch", "pipeline.job", "pipeline.train"} & set(sys.modules), "the login node imported the job"

# the job: the registry and the runner's hooks
from pipeline.job import drills

assert drills.needs_reference(p.cfg.drill) and drills.BY_NAME["dummy"].spec.name == "dummy"
ctx = SimpleNamespace(cfg=p.cfg, renv=SimpleNamespace(rank=0, is_main=True), first=True, slurm=None)
(hook,) = drills.build_hooks(ctx)
assert type(hook).__name__ == "DummyHook" and hook.at_step == 4
assert drill_label(p.cfg) == "dummy" and p.point_id.endswith("-dummy")  # sq.drills, the run's name

# the report: the drill's run joins its candidate's row (drills are not part of a candidate)
# and is named by its run's name; no list of drills is read
from analysis.references import References
from analysis.report import candidate_table
from analysis.runs import RunRecord, Sweep, check_runs
from analysis.table import build_rows

assert candidate_name(p.cfg) == candidate_name(plain.cfg)


def run(point, run_id, metrics):
    tags = {K.TAG_CANDIDATE: candidate_name(point.cfg), K.TAG_DRILLS: drill_label(point.cfg),
            K.TAG_OUTCOME: "accepted", K.TAG_PARTITION: point.cfg.partition.name}
    return RunRecord(run_id, point.point_id, "FINISHED", 1, tags, {}, metrics)


runs = [run(plain, "r1", {K.PERF_TOKENS_PER_S: 10.0}), run(p, "r2", {})]
sweep = Sweep("s", "0", run(plain, "parent", {}), runs)
(row,) = build_rows(sweep, References("none"))
assert [r.tag(K.TAG_DRILLS) for r in row.runs] == ["none", "dummy"], row.runs
assert row.outcome_text() == "2 accepted", row.outcome_text()
(line,) = candidate_table([row]).rows
assert line[:2] == [candidate_name(p.cfg), "2 accepted"], line
assert any(f"run '{p.point_id}'" in m and "logged no metrics" in m for m in check_runs(sweep))
print("ok")
"""


PACKAGE = ("pipeline", "analysis", "conf")


def _copy_with_dummy(root: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__")
    for name in PACKAGE:
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "pipeline" / "drills" / "dummy.py").write_text(textwrap.dedent(MODULE))
    (root / "conf" / "drill" / "dummy.yaml").write_text("dummy:\n  enabled: true\n")


def _files(root: Path) -> set[str]:
    return {
        str(f.relative_to(root))
        for name in PACKAGE
        for f in (root / name).rglob("*")
        if f.is_file() and "__pycache__" not in f.parts
    }


def test_a_dummy_drill_in_its_own_module_is_picked_up_everywhere(tmp_path: Path) -> None:
    _copy_with_dummy(tmp_path)
    added = _files(tmp_path) - _files(REPO)
    # the docs' count (docs/design.md, "Drills"): its module, its YAML and this test, none edited
    assert added == {"pipeline/drills/dummy.py", "conf/drill/dummy.yaml"}
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("SQ_CONF_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_copy_without_the_dummy_has_none(tmp_path: Path) -> None:
    from pipeline.config.schema import DrillConfig

    assert "dummy" not in DrillConfig().sections()  # the repository's own package is untouched
