"""What an interrupting drill must show before its point can pass (docs/design.md, "Drills").

A drill passes only on evidence that what it claims happened, read from the point's attempt
records (`attempts.json`, one per allocation, the current attempt last). A run that trained
through from step 0 matches its uninterrupted reference whatever happened, so the losses alone
prove nothing: the stop, the save, the requeue and the resume must each be on record.

The rule is the same for every interrupting drill: an attempt of the run (not of its
reference) stopped for one of the drill's stop reasons (for a drill that needs its own trigger,
in an attempt where the trigger fired), showed what the drill's entry asks at that stop (by
default: the signal, and every rank saved at that step boundary), and every train-phase stop
was followed by a resume from what it saved (on Slurm: with Slurm's restart count grown). What
each drill produces and checks beyond that is its entry in pipeline.job.drills.
Pure functions: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.contract.records import AttemptFacts, KillRecord, Phase
from pipeline.job.drills import BY_NAME

__all__ = ["AttemptFacts", "KillRecord", "missing_evidence"]


def missing_evidence(
    drill: str,
    attempts: Sequence[AttemptFacts],
    kill: KillRecord | None = None,
    kill_rank: int | None = None,
    pg_timeout_s: float | None = None,
) -> list[str]:
    """What `drill` (an interrupting drill of pipeline.job.drills) lacks on record; [] when it
    all happened. `attempts`: every attempt of the point, oldest first, the current one last."""
    spec = BY_NAME[drill]
    stops = [
        a
        for a in attempts[:-1]
        if a.stop in spec.stops and a.phase == Phase.TRAIN and (a.drill_fired or not spec.needs_trigger)
    ]
    missing = spec.before_stop(kill, kill_rank)
    if not stops:
        seen = ", ".join(f"attempt {a.index + 1}: {a.stop}/{a.phase}" for a in attempts[:-1] if a.stop)
        what = f"a stop of the run by {spec.stopped_by}"
        return [*missing, f"{what} (the run was never interrupted{'; stops: ' + seen if seen else ''})"]
    first = stops[0]
    if spec.at_stop is not None:
        missing += spec.at_stop(first, pg_timeout_s)
    else:
        missing += _saved_at_signal(first)
    return missing + _resumes(attempts)


def _saved_at_signal(first: AttemptFacts) -> list[str]:
    """A signal stopped the attempt, and every rank saved at that step boundary."""
    if not first.signal:
        return [f"the signal that stopped attempt {first.index + 1}"]
    if first.saved_step != first.stop_step:
        return [
            f"a save at the step boundary: attempt {first.index + 1} stopped after step {first.stop_step}, "
            f"its newest checkpoint was step {first.saved_step}"
        ]
    return []


def _resumes(attempts: Sequence[AttemptFacts]) -> list[str]:
    """Every train-phase stop followed by a resume from what it saved, with Slurm's restart
    count grown where there is one (or a resubmission by `qualify resume` on record)."""
    out = []
    for stop, nxt in zip(attempts[:-1], attempts[1:], strict=True):
        if not stop.stop or stop.phase != Phase.TRAIN or not stop.saved_step:
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
