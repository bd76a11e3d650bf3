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
from pipeline.drills.timeout import StepFloor
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
    (floor,) = drills.build_hooks(_ctx(_only("timeout", step_floor_s=0.25)))  # a paced run
    assert isinstance(floor, StepFloor) and floor.floor_s == 0.25


def _paced_trainer() -> SimpleNamespace:
    from pipeline.train.trainer import StopFlag

    return SimpleNamespace(stop=StopFlag(), result=SimpleNamespace(timeline={}))


def test_a_paced_run_starts_its_steps_a_floor_apart_and_counts_the_sleep() -> None:
    """The time-out drill's pace, by the wall clock: after the attempt's first step, each step
    (its work, then its hook) lasts at least the floor, a longer one no longer than its work;
    what was slept is on the timeline (Mark.PACED_S): the floor less each short step's work."""
    import time

    from pipeline.measure.timeline import Mark

    hook, trainer = StepFloor(0.2), _paced_trainer()
    starts, work = [], [0.0, 0.05, 0.0, 0.3, 0.0]  # seconds each step computes
    for step, busy in enumerate(work, 1):
        starts.append(time.perf_counter())
        time.sleep(busy)
        hook.after_step(trainer, step)
    starts.append(time.perf_counter())
    took = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert took[0] < 0.15, took  # the attempt's first step is not held back
    assert all(t >= 0.2 - 0.002 for t in took[1:]), took
    assert took[3] < 0.3 + 0.15, took  # longer than the floor: no sleep after it
    slept = trainer.result.timeline[Mark.PACED_S]  # a loaded machine wakes the waits late, never early
    assert (0.2 - 0.05) + 0.2 + 0.2 - 0.01 <= slept < 0.55 + 0.3, (slept, took)


def test_a_signal_during_a_paced_sleep_ends_it_at_once() -> None:
    """A real signal whose handler only sets the stop flag (as the job's do) ends the pace's sleep
    long before the floor: the stop is taken at this step boundary, not a floor later."""
    import signal
    import time

    hook, trainer = StepFloor(30.0), _paced_trainer()
    old = signal.signal(signal.SIGALRM, lambda *_: trainer.stop.set("SIGALRM"))
    try:
        hook.after_step(trainer, 1)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.perf_counter()
        hook.after_step(trainer, 2)
        took = time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert trainer.stop.is_set() and 0.15 < took < 5.0, took
