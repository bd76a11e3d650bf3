"""Rank 0's `progress.json` in the point folder: what the running attempt is doing (the phase and
its detail, pipeline/train/progress.py), how far it is (step k of n) and at what pace (the
median of its latest step times). `qualify status` and a local sweep read it; a point with no
progress file yet is queued. Torch-free.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pipeline.train.progress import STARTING, TRAINING, NullProgress

log = logging.getLogger(__name__)

PACE_STEPS = 20  # the pace is the median of this many latest step times


class ProgressFile:
    """Rank 0's progress, handed to `write` (PointDir.write_progress: an atomic JSON write) at
    most once per `min_interval_s`: a new phase is written at once, or by a background thread
    within `min_interval_s` when the last write is more recent than that; the step alone every
    `step_every_s` of training. So a checkpoint every step costs at most one write a second."""

    def __init__(
        self,
        write: Callable[[dict[str, Any]], None],
        attempt: int,
        started: float,
        min_interval_s: float = 1.0,
        step_every_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._write, self._clock = write, clock
        self.min_interval_s, self.step_every_s = min_interval_s, step_every_s
        self._lock = threading.Lock()  # the state
        self._io = threading.Lock()  # one write at a time, in order: the file is never older than a write
        self._paces: deque[float] = deque(maxlen=PACE_STEPS)
        now = clock()
        self.state: dict[str, Any] = {
            "attempt": attempt,
            "pid": os.getpid(),
            "started": started,
            "phase": STARTING,
            "detail": "importing",
            "phase_since": now,
        }
        self._last_write = -1e18
        self._pending = True  # the state has a phase the file does not have yet
        self._closed = threading.Event()
        self._flush_now()
        self._thread = threading.Thread(target=self._loop, name="sq-progress", daemon=True)
        self._thread.start()

    def phase(self, phase: str, detail: str = "") -> None:
        with self._lock:
            if (self.state["phase"], self.state["detail"]) == (phase, detail):
                return
            self.state.update(phase=phase, detail=detail, phase_since=self._clock())
            self._pending = True
        if self._clock() - self._last_write >= self.min_interval_s:
            self._flush_now()

    def step(self, step: int, steps: int, seconds: float) -> None:
        """Step `step` of `steps` took `seconds`: the phase is training (or the drill whose
        steps these are, through `within`)."""
        self._paces.append(seconds)
        with self._lock:
            self.state.update(step=step, steps=steps, step_time_s=statistics.median(self._paces))
        self.phase(TRAINING, "")
        if self._clock() - self._last_write >= self.step_every_s:
            self._flush_now()

    def within(self, phase: str, label: str) -> _Within:
        """A view for a drill's own trainer (the reference run): its phases and steps are
        reported as `phase`, detail `label: ...`, with its own pace."""
        return _Within(self, phase, label)

    def expect(self, **facts: Any) -> None:
        """Facts about what comes after training, for the estimate of the time left (e.g.
        drill_steps: the reference run's steps)."""
        with self._lock:
            self.state.update(facts)

    def close(self) -> None:
        self._closed.set()
        self._flush_now()

    def _loop(self) -> None:
        while not self._closed.wait(self.min_interval_s):
            if self._pending:
                self._flush_now()

    def _flush_now(self) -> None:
        with self._io:
            with self._lock:
                data = {**self.state, "time": self._clock()}
                self._pending = False
                self._last_write = data["time"]
            try:
                self._write(data)
            except OSError as e:  # a full or read-only disk is the run's to report, not this file's
                log.warning("could not write progress.json: %s", e)


class _Within:
    """ProgressFile seen from a drill's trainer: every phase becomes `phase`, labelled."""

    def __init__(self, base: ProgressFile, phase: str, label: str) -> None:
        self.base, self._phase, self.label = base, phase, label
        self._paces: deque[float] = deque(maxlen=PACE_STEPS)

    def phase(self, phase: str, detail: str = "") -> None:
        self.base.phase(self._phase, f"{self.label}: {detail or phase}")

    def step(self, step: int, steps: int, seconds: float) -> None:
        self._paces.append(seconds)
        with self.base._lock:
            self.base.state.update(
                step=step, steps=steps, step_time_s=statistics.median(self._paces), drill_steps=0
            )
        self.base.phase(self._phase, self.label)
        if self.base._clock() - self.base._last_write >= self.base.step_every_s:
            self.base._flush_now()


def progress_for(write: Callable[[dict[str, Any]], None] | None, attempt: int, started: float) -> Any:
    """A ProgressFile for rank 0 (`write` given), a NullProgress for the other ranks."""
    return NullProgress() if write is None else ProgressFile(write, attempt, started)
