"""A running point's progress (pipeline/job/progress.py) and what `qualify status` makes of it:
the writes are throttled (at most one a second, a new phase within a second), the phase text a
person reads, and the sweep's time left, against hand computations."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pipeline.contract.pointdir import PointDir
from pipeline.job.progress import ProgressFile
from pipeline.submit.manifest import PointEntry
from pipeline.submit.status import PointState, live_lines, phase_text, point_left_s, sweep_eta


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_progress_writes_a_new_phase_at_once_and_steps_every_few_seconds() -> None:
    clock, writes = Clock(), []
    p = ProgressFile(
        writes.append, attempt=0, started=990.0, min_interval_s=1.0, step_every_s=5.0, clock=clock
    )
    p._closed.set()  # no background thread in this test: only the calls' own writes
    assert [(w["phase"], w["detail"]) for w in writes] == [("starting", "importing")]
    clock.t += 2
    p.phase("starting", "building the model")
    assert writes[-1]["detail"] == "building the model" and len(writes) == 2
    clock.t += 0.3  # within a second of the last write: left to the background thread
    p.phase("starting", "the first step")
    assert len(writes) == 2 and p._pending
    clock.t += 1.0
    for k in range(1, 31):  # 30 steps of 0.1 s: a write at the phase change, then one per 5 s
        p.step(k, 100, 0.1 if k != 3 else 9.0)  # one slow step: the pace is a median
        clock.t += 0.1
    steps = [w for w in writes if w["phase"] == "training"]
    assert len(steps) == 1 and steps[0]["step"] == 1, steps
    clock.t += 5.0
    p.step(31, 100, 0.1)
    assert writes[-1]["step"] == 31 and writes[-1]["step_time_s"] == pytest.approx(0.1)
    assert writes[-1]["steps"] == 100 and writes[-1]["attempt"] == 0 and writes[-1]["started"] == 990.0


def test_progress_thread_writes_a_deferred_phase_within_its_interval(tmp_path: Path) -> None:
    point = PointDir(tmp_path).create()
    p = ProgressFile(point.write_progress, attempt=1, started=time.time(), min_interval_s=0.2)
    p.phase("checkpoint", "saving step 7")  # within 0.2 s of the first write: deferred
    deadline = time.monotonic() + 5
    while (point.read_progress() or {}).get("phase") != "checkpoint" and time.monotonic() < deadline:
        time.sleep(0.05)
    p.close()
    assert point.read_progress() is not None and point.read_progress()["detail"] == "saving step 7"
    assert json.loads((tmp_path / "progress.json").read_text())["attempt"] == 1


def test_a_drill_view_reports_its_own_steps_and_pace() -> None:
    clock, writes = Clock(), []
    p = ProgressFile(writes.append, attempt=0, started=990.0, step_every_s=0.0, clock=clock)
    p._closed.set()
    p.expect(drill_steps=40)
    clock.t += 2
    p.step(40, 40, 0.5)
    ref = p.within("drill", "reference run")
    clock.t += 2
    ref.phase("starting", "building the model")
    assert (writes[-1]["phase"], writes[-1]["detail"]) == ("drill", "reference run: building the model")
    clock.t += 2
    ref.step(3, 40, 0.25)
    w = writes[-1]
    assert (w["phase"], w["detail"], w["step"], w["step_time_s"], w["drill_steps"]) == (
        "drill", "reference run", 3, 0.25, 0,
    )  # fmt: skip
    assert phase_text(w, now=w["time"]) == "drill: reference run step 3/40, 0.25 s/step"


def test_phase_text_says_what_a_person_needs() -> None:
    now = 2000.0
    assert phase_text(None, now).startswith("starting (")
    starting = {"phase": "starting", "detail": "building the model", "phase_since": now - 75, "time": now - 1}
    assert phase_text(starting, now) == "starting: building the model (1m15s so far)"
    training = {"phase": "training", "detail": "", "step": 120, "steps": 400, "step_time_s": 0.21,
                "attempt": 1, "time": now - 2}  # fmt: skip
    assert phase_text(training, now) == "training step 120/400, 0.21 s/step, attempt 2"
    stale = {**training, "time": now - 600}
    assert phase_text(stale, now).endswith("[reported 10m00s ago]")


def _state(
    tmp_path: Path, name: str, state: str, progress: dict | None = None, wall: float | None = None
) -> PointState:
    point = PointDir(tmp_path / name).create()
    if progress is not None:
        point.write_progress(progress)
    if wall is not None:
        point.append_attempt({"allocated_s": wall})
    entry = PointEntry(point_id=name, index=0, overrides=[], candidate="c", partition="p",
                       drills="none", point_dir=str(point.path), mem_verdict="fits")  # fmt: skip
    return PointState(entry, state, {"outcome": state} if wall is not None else None)


def test_sweep_time_left_by_hand(tmp_path: Path) -> None:
    now = 5000.0
    done = [_state(tmp_path, f"d{i}", "accepted", wall=w) for i, w in enumerate((50.0, 70.0, 60.0))]
    # 100 steps left at 0.5 s = 50 s, plus a reference run of 200 steps = 100 s: 150 s
    a = _state(tmp_path, "a", "running", {"phase": "training", "step": 100, "steps": 200,
                                          "step_time_s": 0.5, "drill_steps": 200, "time": now})  # fmt: skip
    b = _state(
        tmp_path,
        "b",
        "running",
        {"phase": "training", "step": 10, "steps": 20, "step_time_s": 2.0, "time": now},
    )
    queued = [_state(tmp_path, f"q{i}", "pending") for i in range(4)]
    assert point_left_s(PointDir(a.entry.point_dir).read_progress()) == 150.0
    eta = sweep_eta([*done, a, b, *queued], now)
    # work: 150 + 20 + 4 x 60 (the median of 50, 60, 70) = 410 s over 2 at a time = 205 s > 150 s
    assert eta.seconds == pytest.approx(205.0)
    assert "4 queued x 1m00s, the median time of 3 ended point(s); 2 at a time" in eta.how
    # one running point alone: the larger of its own time left and the work left
    assert sweep_eta([*done, a], now).seconds == pytest.approx(150.0)
    # before any step and any ended point: not estimated, and why
    c = _state(tmp_path, "c", "running", {"phase": "starting", "detail": "importing", "time": now})
    unknown = sweep_eta([c, *queued], now)
    assert unknown.seconds is None and "has not finished a step" in unknown.text()
    # a starting point once points have ended: the median time less what it has run so far
    c2 = _state(tmp_path, "c2", "running", {"phase": "starting", "started": now - 20, "time": now})
    assert sweep_eta([*done, c2], now).seconds == pytest.approx(40.0)
    lines = live_lines([*done, a, b, *queued], now)
    assert "running a: training step 100/200, 0.5 s/step" in lines
    assert "queued: 4 point(s)" in lines and lines[-1].startswith("time left: about 3m25s (")


def test_before_any_point_ended_the_queue_is_timed_by_the_running_point(tmp_path: Path) -> None:
    now = 5000.0
    # 30 s so far, 140 steps left at 0.5 s = 70 s: a point takes 100 s; 2 queued: 70 + 200 s
    a = _state(tmp_path, "a", "running", {"phase": "training", "step": 60, "steps": 200,
                                          "step_time_s": 0.5, "started": now - 30, "time": now})  # fmt: skip
    queued = [_state(tmp_path, f"q{i}", "pending") for i in range(2)]
    eta = sweep_eta([a, *queued], now)
    assert eta.seconds == pytest.approx(270.0)
    assert "2 queued x 1m40s, the running points' projected time; 1 at a time" in eta.how
