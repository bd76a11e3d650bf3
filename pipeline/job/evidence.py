"""What an interrupting drill must show before its point can pass (docs/design.md, "Drills").

A drill passes only on evidence that what it claims happened, read from the point's attempt
records (`attempts.json`, one per allocation, the current attempt last). A run that trained
through from step 0 matches its uninterrupted reference whatever happened, so the losses alone
prove nothing: the stop, the save, the requeue and the resume must each be on record.

- preempt: a preemption signal stopped an attempt of the run (not its reference) in which the
  drill's trigger fired (a `qualify cancel`'s SIGTERM is no preemption drill), every rank
  saved at that step boundary, the job came back (on Slurm: Slurm's restart count grew), and
  the next attempt loaded that checkpoint at that step and continued from it.
- timeout: the same, for the time-limit warning.
- kill_worker: the chosen rank died (its own record), the survivors' collectives failed within
  the process-group timeout, and the next attempt loaded the last interval checkpoint saved
  before the kill (one must exist: a resume from step 0 proves nothing).
Every train-phase stop, whatever its kind, must be followed by a resume from what it saved.

Pure functions: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STOP_KINDS = {
    "preempt": ("preempt", "terminated"),  # USR2 from the scheduler's warning; SIGTERM from a requeue
    "timeout": ("timeout",),
    "kill_worker": ("peer_failure",),
}
"""The stop reasons (pipeline.job.drills.StopRecord.reason) each interrupting drill produces."""


@dataclass(frozen=True)
class AttemptFacts:
    """What one attempt left on record that the evidence reads."""

    index: int
    start_step: int = 0
    """The step the attempt's run started after: the loaded checkpoint's, else 0."""
    loaded_step: int | None = None
    """The run's checkpoint the attempt loaded; None: it loaded none."""
    fallbacks: int = 0
    """Newer checkpoints skipped on load because they did not check out."""
    slurm_restarts: int | None = None
    """SLURM_RESTART_COUNT of the allocation; None off Slurm."""
    stop: str = ""
    """Why it stopped to be resumed (preempt, terminated, timeout, peer_failure); "" if it ended."""
    phase: str = "train"
    """train | reference: which run it was in when it stopped."""
    signal: str = ""
    """The signal that stopped it (or what failed, for a peer failure)."""
    stop_step: int | None = None
    """The last step it finished."""
    saved_step: int | None = None
    """The newest checkpoint committed when it stopped (0: none)."""
    failed_after_s: float | None = None
    """peer_failure: seconds from the kill to the survivors' failed collective."""
    drill_fired: bool = False
    """The preempt drill's trigger fired in this attempt (a cancel's SIGTERM is no drill)."""
    resubmitted: bool = False
    """`qualify resume` submitted the point again after this attempt (a new job, not a requeue)."""

    @classmethod
    def from_record(cls, index: int, rec: Mapping[str, Any]) -> AttemptFacts:
        """From an attempts.json record (keys written by pipeline.job.entry)."""

        def num(key: str) -> Any:
            value = rec.get(key)
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None

        return cls(
            index=index,
            start_step=int(num("start_step") or 0),
            loaded_step=None if num("loaded_step") is None else int(num("loaded_step")),
            fallbacks=int(num("fallbacks") or 0),
            slurm_restarts=None if num("slurm_restarts") is None else int(num("slurm_restarts")),
            stop=str(rec.get("stop") or ""),
            phase=str(rec.get("phase") or "train"),
            signal=str(rec.get("signal") or ""),
            stop_step=None if num("stop_step") is None else int(num("stop_step")),
            saved_step=None if num("saved_step") is None else int(num("saved_step")),
            failed_after_s=num("failed_after_s"),
            drill_fired=bool(rec.get("drill_fired")),
            resubmitted=bool(rec.get("resubmitted")),
        )


@dataclass(frozen=True)
class KillRecord:
    """What the killed rank wrote just before it died (PointDir.write_kill)."""

    rank: int
    after_step: int


def missing_evidence(
    drill: str,
    attempts: Sequence[AttemptFacts],
    kill: KillRecord | None = None,
    kill_rank: int | None = None,
    pg_timeout_s: float | None = None,
) -> list[str]:
    """What `drill` (preempt | timeout | kill_worker) lacks on record; [] when it all happened.
    `attempts`: every attempt of the point, oldest first, the current one last."""
    kinds = STOP_KINDS[drill]
    stops = [
        a
        for a in attempts[:-1]
        if a.stop in kinds and a.phase == "train" and (drill != "preempt" or a.drill_fired)
    ]
    missing: list[str] = []
    if drill == "kill_worker":
        missing += _killed(kill, kill_rank)
    if not stops:
        seen = ", ".join(f"attempt {a.index + 1}: {a.stop}/{a.phase}" for a in attempts[:-1] if a.stop)
        what = (
            "a stop of the run by "
            + {
                "preempt": "a preemption signal",
                "timeout": "the time-limit warning",
                "kill_worker": "the survivors of the killed rank",
            }[drill]
        )
        return [*missing, f"{what} (the run was never interrupted{'; stops: ' + seen if seen else ''})"]
    first = stops[0]
    if drill == "kill_worker":
        missing += _survivors(first, pg_timeout_s)
    elif not first.signal:
        missing.append(f"the signal that stopped attempt {first.index + 1}")
    elif first.saved_step != first.stop_step:
        missing.append(
            f"a save at the step boundary: attempt {first.index + 1} stopped after step {first.stop_step}, "
            f"its newest checkpoint was step {first.saved_step}"
        )
    return missing + _resumes(attempts)


def _killed(kill: KillRecord | None, rank: int | None) -> list[str]:
    if kill is None:
        return [f"the death of rank {rank} (it left no record of being killed)"]
    if rank is not None and kill.rank != rank:
        return [f"the death of rank {rank} (rank {kill.rank} died instead)"]
    return []


def _survivors(stop: AttemptFacts, pg_timeout_s: float | None) -> list[str]:
    out = []
    if stop.failed_after_s is None:
        out.append(f"the time the survivors of attempt {stop.index + 1} failed after the kill")
    elif pg_timeout_s is not None and stop.failed_after_s > pg_timeout_s:
        out.append(
            f"the survivors failing within the process-group timeout ({pg_timeout_s:.0f} s): "
            f"they failed {stop.failed_after_s:.0f} s after the kill"
        )
    if not stop.saved_step:
        out.append(
            f"an interval checkpoint before the kill (none was committed by step {stop.stop_step}): "
            "a resume from step 0 proves nothing; set train.checkpoint_interval below the kill step"
        )
    return out


def _resumes(attempts: Sequence[AttemptFacts]) -> list[str]:
    """Every train-phase stop followed by a resume from what it saved, with Slurm's restart
    count grown where there is one (or a resubmission by `qualify resume` on record)."""
    out = []
    for stop, nxt in zip(attempts[:-1], attempts[1:], strict=True):
        if not stop.stop or stop.phase != "train" or not stop.saved_step:
            continue
        where = f"attempt {nxt.index + 1}"
        if nxt.loaded_step is None:
            out.append(
                f"{where} loading the checkpoint of step {stop.saved_step}: it loaded none and trained "
                f"from step {nxt.start_step}"
            )
        elif nxt.loaded_step != stop.saved_step or nxt.fallbacks:
            fell = f" after skipping {nxt.fallbacks} newer one(s)" if nxt.fallbacks else ""
            out.append(
                f"{where} loading the checkpoint of step {stop.saved_step}: it loaded step "
                f"{nxt.loaded_step}{fell}"
            )
        elif nxt.start_step != stop.saved_step:
            out.append(
                f"{where} continuing from step {stop.saved_step}: it started after step {nxt.start_step}"
            )
        if (
            not stop.resubmitted
            and stop.slurm_restarts is not None
            and nxt.slurm_restarts is not None
            and nxt.slurm_restarts <= stop.slurm_restarts
        ):
            out.append(f"a requeue by Slurm before {where} (SLURM_RESTART_COUNT stayed {nxt.slurm_restarts})")
    return out
