"""The drill registry (pipeline.drills, one module per drill with its runtime part; the job's view
of it in pipeline.job.drills.DRILLS) is the one list of drills: the config's sections, the conf/drill presets, the drill modules and
the docs agree with it, and what the job reads from it (hooks, interrupting drills, the
reference run) follows each drill's entry."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.config.schema import DrillConfig
from pipeline.contract.records import StopReason
from pipeline.drills.kill_worker import KillWorkerDrill
from pipeline.drills.preempt import PreemptDrill
from pipeline.job import drills

REPO = Path(__file__).resolve().parents[2]
NAMES = [d.name for d in drills.DRILLS]


def _only(name: str, **options: object) -> DrillConfig:
    cfg = DrillConfig()
    section = getattr(cfg, name)
    setattr(cfg, name, dataclasses.replace(section, enabled=True, **options))
    return cfg


def test_every_config_section_is_a_registered_drill_and_back() -> None:
    assert list(DrillConfig().sections()) == NAMES
    assert len(set(NAMES)) == len(NAMES)


def test_every_drill_has_its_module_and_its_preset() -> None:
    presets = {p.stem for p in (REPO / "conf" / "drill").glob("*.yaml")}
    assert presets == {*NAMES, "none"}
    for name in NAMES:
        declared = importlib.import_module(f"pipeline.drills.{name}")
        assert declared.SPEC is drills.BY_NAME[name].spec
    # the job's side holds only what the drills share: no drill has a second module there
    shared = {m.name for m in pkgutil.iter_modules(drills.__path__)}
    assert not shared & set(NAMES), shared


def test_docs_name_every_drill() -> None:
    design = (REPO / "docs" / "design.md").read_text()
    assert all(f"`{n}`" in design for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_config_and_the_registry_agree_on_what_interrupts(name: str) -> None:
    cfg = _only(name)
    spec = drills.BY_NAME[name]
    assert cfg.enabled_names() == [name] and [d.name for d in drills.enabled(cfg)] == [name]
    assert cfg.interrupting() == drills.interrupting(cfg) == ([name] if spec.interrupting else [])
    assert drills.needs_reference(cfg) is spec.reference
    cfg.reference = False
    assert drills.needs_reference(cfg) is False


def test_every_stop_reason_belongs_to_a_drill_but_one_kind() -> None:
    produced = {r for d in drills.DRILLS for r in d.stops}
    assert produced == set(StopReason)  # terminated: a requeue's SIGTERM counts for preempt


def _ctx(cfg: DrillConfig, rank: int = 1, first: bool = True) -> SimpleNamespace:
    renv = SimpleNamespace(rank=rank, is_main=rank == 0)
    return SimpleNamespace(cfg=SimpleNamespace(drill=cfg), renv=renv, point=None, first=first, slurm=None)


def test_hooks_follow_the_enabled_drills() -> None:
    assert drills.build_hooks(_ctx(DrillConfig())) == []
    (kill,) = drills.build_hooks(_ctx(_only("kill_worker", rank=1)))
    assert isinstance(kill, KillWorkerDrill) and kill.armed  # rank 1, first attempt
    (later,) = drills.build_hooks(_ctx(_only("kill_worker", rank=1), first=False))
    assert not later.armed  # a requeued attempt kills no one
    (preempt,) = drills.build_hooks(_ctx(_only("preempt")))
    assert isinstance(preempt, PreemptDrill) and not preempt.fired
    assert drills.build_hooks(_ctx(_only("timeout"))) == []  # the scheduler sends its signal
