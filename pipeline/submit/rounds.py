"""The records of an adaptive sweep on Slurm, in its folder's `adaptive/` (SweepDir owns the
paths): what the controller jobs (pipeline/submit/controller.py) write and `qualify status`
reads. Every file is written atomically (`pipeline.files.write_json`). Torch-free.

    state.json      the rounds' settings: most repeats, the controllers' partition and limit
    round-<k>.json  round k's marker (`RoundMarker`): written before anything of the round is
                    submitted, completed step by step (its points' ids, their job ids, released,
                    the controller that follows it)
    ended.json      why the rounds ended, and what they cost (`Ended`)
    stopped.json    `qualify cancel` stopped the rounds (removed by `qualify resume`)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.contract.sweepdir import SweepDir
from pipeline.files import read_json, write_json
from pipeline.sched import sweep_job_name

CONTROLLER_ENDED_BADLY = (
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "CANCELLED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)
"""sacct states of a controller job that did not finish its round's work (resume submits it again)."""


def controller_job_name(sweep_id: str) -> str:
    """The controllers' job name: the sweep's, marked (status and billing tell them from points)."""
    return f"{sweep_job_name(sweep_id)}-ctl"


@dataclass
class AdaptiveState:
    max_repeats: int
    partition: str
    time_min: int
    candidates: list[str]

    def write(self, sd: SweepDir) -> None:
        sd.adaptive.mkdir(parents=True, exist_ok=True)
        write_json(sd.adaptive_state, asdict(self))

    @classmethod
    def read(cls, sd: SweepDir) -> AdaptiveState | None:
        data = read_json(sd.adaptive_state)
        return cls(**data) if isinstance(data, dict) else None


@dataclass
class RoundMarker:
    """Round k: who is repeated, and how far its submission got. A marker with `point_ids` and
    no `job_ids` is a submission that did not finish (its held jobs, if any, are cancelled and
    it is submitted again); with `job_ids` it is never submitted again."""

    round: int
    chosen: list[str]  # the candidates that get one more repeat (round 1: every candidate)
    contenders: list[str]  # the candidates in contention when the round was planned
    point_ids: list[str]
    job_ids: list[str] = field(default_factory=list)
    released: bool = False
    controllers: list[str] = field(default_factory=list)
    """The controller jobs submitted after this round, oldest first (resume adds one)."""

    def write(self, sd: SweepDir) -> None:
        sd.adaptive.mkdir(parents=True, exist_ok=True)
        write_json(sd.round_marker(self.round), asdict(self))

    @classmethod
    def read(cls, sd: SweepDir, k: int) -> RoundMarker | None:
        data = read_json(sd.round_marker(k))
        return cls(**data) if isinstance(data, dict) else None

    @property
    def submitted(self) -> bool:
        """Its points are queued and released and its controller is queued."""
        return bool(self.job_ids) and self.released and bool(self.controllers)


def markers(sd: SweepDir) -> list[RoundMarker]:
    out = []
    for path in sd.round_markers():
        with contextlib.suppress(OSError, ValueError, TypeError):
            out.append(RoundMarker(**json.loads(path.read_text())))
    return out


@dataclass
class Ended:
    rounds: int
    why: str
    contenders: list[str]
    gpu_hours: float
    full_grid_gpu_hours: float | None
    controller_s: float | None
    """The controller jobs' allocations (sacct ElapsedRaw, one task each): the qualification's
    overhead, billed to no candidate; None when sacct had no record."""
    line: str

    def write(self, sd: SweepDir) -> None:
        write_json(sd.adaptive_ended, asdict(self))

    @classmethod
    def read(cls, sd: SweepDir) -> Ended | None:
        data = read_json(sd.adaptive_ended)
        return cls(**data) if isinstance(data, dict) else None


def stopped(sd: SweepDir) -> dict[str, Any] | None:
    data = read_json(sd.adaptive_stopped)
    return dict(data) if isinstance(data, dict) else None


@contextlib.contextmanager
def round_lock(sd: SweepDir) -> Iterator[None]:
    """Held by whoever decides or submits a round (a controller, resume) or stops the rounds
    (cancel): a round is planned and submitted by one of them at a time."""
    sd.adaptive.mkdir(parents=True, exist_ok=True)
    with open(sd.adaptive_lock, "a") as f:  # a lock, never written
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def all_controllers(sd: SweepDir) -> list[str]:
    return [j for mk in markers(sd) for j in mk.controllers]
