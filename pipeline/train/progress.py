"""What the trainer says about its progress, and to whom: a `Progress` (the job's rank 0 writes
it to the point folder, pipeline.job.progress) or a `NullProgress`. The trainer knows nothing of
files. Phases, in the order an attempt meets them:

    starting    importing, the process group, the probes, building the model, the DeepSpeed
                engine (a C++ op not built at install time is compiled in these two), loading
                the checkpoint, the first step
    training    step k of n (evaluations of the held-out loss included)
    checkpoint  a save, or a round trip (save, restore into a fresh engine, compare)
    drill       a drill's own work: the uninterrupted reference run (step k of n), the reshape
    finishing   the results, the outcome
"""

from __future__ import annotations

from typing import Protocol

STARTING, TRAINING, CHECKPOINT, DRILL, FINISHING = "starting", "training", "checkpoint", "drill", "finishing"
PHASES = (STARTING, TRAINING, CHECKPOINT, DRILL, FINISHING)


class Progress(Protocol):
    def phase(self, phase: str, detail: str = "") -> None: ...

    def step(self, step: int, steps: int, seconds: float) -> None: ...


class NullProgress:
    """Every rank but rank 0, and trainers outside a job (tests, benchmarks)."""

    def phase(self, phase: str, detail: str = "") -> None:
        pass

    def step(self, step: int, steps: int, seconds: float) -> None:
        pass

    def within(self, phase: str, label: str) -> NullProgress:
        return self

    def expect(self, **facts: object) -> None:
        pass

    def close(self) -> None:
        pass
