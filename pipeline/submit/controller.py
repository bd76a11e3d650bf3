"""sweep.adaptive on Slurm: rounds that submit themselves, the login node never waiting.

`qualify sweep` queues round 1 (one repeat of every point) and, after it, a small controller job
(`begin`): one task on `sweep.controller_partition` (default the sweep's cheapest partition),
`sweep.controller_time_min` minutes, `--dependency=afterany:<round 1's arrays>`; then it returns.
The controller (`python -m pipeline.submit.controller <sweep folder> <k>`, `advance`) runs
the login node's code on a compute node: once every point of round k has its outcome (Slurm's
records reconciled as `qualify status` does, the ended jobs billed from sacct), it applies the
local rounds' rule (`adaptive.decide`) and either submits round k+1's repeats into the same
sweep folder, manifest and MLflow parent, followed by its own successor controller, or ends
the rounds (`ended.json`, the parent run tagged with why; it is closed by the last point).

Exactly once: each round has a marker (pipeline/submit/rounds.py), written atomically before
anything of the round is submitted and completed step by step under a lock (`complete`):
points added to the manifest, their arrays queued *held*, the ids recorded, released, the
next controller queued held, recorded, released. A controller run again (requeued, a duplicate,
`qualify resume`) finds the marker and only finishes what it lacks; a submission cut between
sbatch and the record of its ids left only held jobs, which it cancels (by the sweep's job
names) before submitting again. Torch-free: the controller job never imports torch.

`SQ_CONTROLLER_PAUSE=<step>` (a `SubmitStep`) makes a controller stop at that step of its
submission, say so in `adaptive/paused-<step>.json` and wait there until it is killed: how the
tests scancel a controller in the middle of a submission, at a known step, on a real cluster.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

from pipeline.config.compose import Point
from pipeline.config.resolved import config_from_yaml
from pipeline.contract.parent import close_if_done
from pipeline.contract.pointdir import PointDir
from pipeline.contract.sweepdir import SweepDir
from pipeline.home import source_checkout
from pipeline.sched import OneTaskJob, Scheduler, SchedulerError, scheduler_for, sweep_job_name
from pipeline.submit import adaptive as A
from pipeline.submit.manifest import Manifest, parent_tracker
from pipeline.submit.rounds import (
    CONTROLLER_ENDED_BADLY,
    AdaptiveState,
    Ended,
    RoundMarker,
    all_controllers,
    controller_job_name,
    markers,
    round_lock,
    stopped,
)
from pipeline.tracking import keys as K
from pipeline.tracking import store

log = logging.getLogger(__name__)

PAUSE_ENV = "SQ_CONTROLLER_PAUSE"


class SubmitStep(StrEnum):
    """The steps of a round's submission (`complete`), each done once, in this order."""

    POINTS_ADDED = "points_added"  # the round's points are in the manifest
    ARRAYS_QUEUED = "arrays_queued"  # sbatch queued their arrays held; no record of the ids yet
    IDS_RECORDED = "ids_recorded"  # the manifest and the marker have the ids
    RELEASED = "released"
    CONTROLLER_QUEUED = "controller_queued"


def pause_if_asked(sd: SweepDir, step: SubmitStep) -> None:
    """Stop here, for good, when SQ_CONTROLLER_PAUSE names `step` (a test's way to kill a
    controller at a known step of its submission); the pause is recorded first."""
    if os.environ.get(PAUSE_ENV) != step.value:
        return
    from pipeline.files import write_json

    write_json(
        sd.controller_paused(step.value),
        {
            "step": step.value,
            "pid": os.getpid(),
            "job_id": os.environ.get("SLURM_JOB_ID", ""),
            "time": time.time(),
        },
    )
    log.warning("%s=%s: paused before the next step, until this job is killed", PAUSE_ENV, step.value)
    while True:
        time.sleep(60)


OUTCOMES_WAIT_S = 180.0
"""How long a controller waits for its round's outcomes after the arrays ended (a job's outcome
file may lag its end; a job that ended without one is recorded lost after status's grace)."""
POLL_S = 2.0


def controller_partition(points: Sequence[Any]) -> str:
    """sweep.controller_partition, else the Slurm partition of the sweep's cheapest point
    (lowest partition.price_usd_per_gpu_hour; unpriced partitions after priced ones)."""
    cfg = points[0].cfg
    if cfg.sweep.controller_partition:
        return str(cfg.sweep.controller_partition)
    slurm = [p.cfg.partition for p in points if p.cfg.partition.slurm_partition]
    inf = float("inf")
    cheapest = min(
        slurm, key=lambda part: inf if part.price_usd_per_gpu_hour is None else part.price_usd_per_gpu_hour
    )
    return str(cheapest.slurm_partition).split(",")[0]


def begin(sweep_dir: Path, points: Sequence[Any], max_repeats: int, sched: Scheduler | None = None) -> str:
    """The login node, once round 1 is queued: the rounds' state, round 1's marker, the first
    controller; its job id. Returns at once."""
    sd = SweepDir(sweep_dir)
    m = Manifest.read(sweep_dir)
    sched = sched or scheduler_for(m.launcher)
    candidates = list(dict.fromkeys(e.candidate for e in m.points))
    cfg = points[0].cfg
    AdaptiveState(max_repeats, controller_partition(points), cfg.sweep.controller_time_min, candidates).write(
        sd
    )
    A.tag_parent(m, sweep_dir, {K.TAG_ADAPTIVE: str(max_repeats)}, reopen=False)
    first = RoundMarker(
        1, candidates, candidates, [e.point_id for e in m.points], [e.job_id for e in m.points], released=True
    )
    with round_lock(sd):
        first.write(sd)
        return submit_controller(sd, first, sched)


def _python_command(sd: SweepDir, k: int) -> str:
    return " ".join(
        shlex.quote(x)
        for x in (sys.executable, "-m", "pipeline.submit.controller", str(sd.path.resolve()), str(k))
    )


def submit_controller(sd: SweepDir, marker: RoundMarker, sched: Scheduler) -> str:
    """Queue the controller that follows `marker`'s round (afterany on the round's jobs still
    in Slurm): held, its id recorded in the marker, released. The caller holds round_lock."""
    st = AdaptiveState.read(sd)
    if st is None:
        raise SchedulerError(f"{sd.adaptive_state} is missing: not an adaptive sweep on Slurm")
    m = Manifest.read(sd.path)
    cancel_orphans(sd, m, sched)  # a controller queued held by a submission cut before its record
    mine = set(marker.point_ids)
    ids = [e.job_id for e in m.points if e.point_id in mine and e.job_id]
    states = sched.job_states(ids, job_name=sweep_job_name(m.sweep_id))
    # a dependency on a job Slurm has forgotten is refused by sbatch: only those it still holds
    after = ids if states is None else [j for j in ids if (s := states.get(j)) is not None and s.in_slurm]
    job = OneTaskJob(
        name=controller_job_name(m.sweep_id),
        partition=st.partition,
        time_min=st.time_min,
        command=_python_command(sd, marker.round),
        workdir=str(source_checkout() or Path.cwd()),
        output=str(sd.controller_log(marker.round)),
        after=tuple(after),
        hold=True,
    )
    job_id = sched.submit_job(job)
    marker.controllers.append(job_id)
    marker.write(sd)
    sched.release([job_id])
    log.info("round %d: controller job %s queued after %d job(s)", marker.round, job_id, len(after))
    return job_id


def cancel_orphans(sd: SweepDir, m: Manifest, sched: Scheduler) -> list[str]:
    """Held jobs of this sweep (points or controllers) that no manifest entry or marker names:
    what a submission cut between sbatch and the record of its ids left. Cancelled. The caller
    holds round_lock (no submission of this sweep is under way)."""
    known = {j.split("_", 1)[0] for j in [*(e.job_id for e in m.points), *all_controllers(sd)] if j}
    orphans = []
    for name in (sweep_job_name(m.sweep_id), controller_job_name(m.sweep_id)):
        named = sched.jobs_named(name)
        if named is None:
            raise SchedulerError(
                f"Slurm did not answer squeue for the jobs named {name}: nothing was submitted"
            )
        orphans += [j for j, s in named.items() if s.held and j.split("_", 1)[0] not in known]
    if orphans:
        log.warning(
            "cancelling %d held job(s) of a submission that did not finish: %s", len(orphans), orphans
        )
        sched.cancel(orphans, best_effort=True)
    return orphans


def complete(sd: SweepDir, marker: RoundMarker, sched: Scheduler) -> None:
    """Finish what `marker`'s round lacks, each step once: its points in the manifest, their
    arrays queued held and recorded, the parent reopened and the arrays released, the next
    controller. The caller holds round_lock."""
    from pipeline.submit.sweep import Plan, _submit_slurm

    m = Manifest.read(sd.path)
    have = {e.point_id for e in m.points}
    if not set(marker.point_ids) <= have:
        pairs = A.add_points(m, sd.path, marker.chosen)
        got = [e.point_id for _, e in pairs]
        if got != marker.point_ids:
            raise RuntimeError(
                f"round {marker.round}: planned points {marker.point_ids}, the manifest gives {got}"
            )
        m.write(sd.path)
        pause_if_asked(sd, SubmitStep.POINTS_ADDED)
    mine_now = [e for e in m.points if e.point_id in set(marker.point_ids)]
    if not marker.job_ids and mine_now and all(e.job_id for e in mine_now):
        # recorded in the manifest already: `qualify resume` ran them (their submission had been
        # cut, then cancel ended them): adopted, never submitted twice
        marker.job_ids = [e.job_id for e in mine_now]
        marker.write(sd)
    if not marker.job_ids:
        cancel_orphans(sd, m, sched)
        mine = set(marker.point_ids)
        pairs = []
        for entry in m.points:
            if entry.point_id in mine:
                text = PointDir(entry.point_dir).config.read_text()
                pairs.append((Point(entry.index, entry.overrides, config_from_yaml(text), text), entry))
        offline = store.unreachable(m.tracking_uri) is not None
        parent = parent_tracker(m, sd.path, offline=offline)
        plan = Plan([p for p, _ in pairs], m.launcher, f"adaptive round {marker.round}", sd.path, m)
        _submit_slurm(plan, pairs, sd.submitit, parent, hold=True, whole_sweep=False)
        parent.close(terminate=False)
        pause_if_asked(sd, SubmitStep.ARRAYS_QUEUED)
        m.write(sd.path)
        marker.job_ids = [e.job_id for _, e in pairs]
        marker.write(sd)
        pause_if_asked(sd, SubmitStep.IDS_RECORDED)
    if not marker.released:
        A.tag_parent(m, sd.path, {K.TAG_POINTS: str(len(m.points))}, reopen=True)
        sched.release(marker.job_ids)
        marker.released = True
        marker.write(sd)
        pause_if_asked(sd, SubmitStep.RELEASED)
    if not marker.controllers:
        submit_controller(sd, marker, sched)
        pause_if_asked(sd, SubmitStep.CONTROLLER_QUEUED)


def _round_points_final(sd: SweepDir, sched: Scheduler) -> Manifest:
    """Wait until every point of the sweep has its outcome (lost jobs recorded as `status`
    records them), then bill the ended ones from sacct; the manifest. Raises TimeoutError."""
    from pipeline.submit.billing import bill_ended_points
    from pipeline.submit.status import FINAL, point_states

    deadline = time.monotonic() + OUTCOMES_WAIT_S
    while True:
        m = Manifest.read(sd.path)
        states = point_states(m)
        left = [s.entry.point_id for s in states if s.state not in FINAL]
        if not left:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(left)} point(s) have no outcome after {OUTCOMES_WAIT_S:.0f} s: {left[:5]}"
            )
        time.sleep(POLL_S)
    ids = [e.job_id for e in m.points if e.job_id]
    for _ in range(10):  # sacct records a job's end a moment after it
        if not bill_ended_points(m, sched.job_states(ids, job_name=sweep_job_name(m.sweep_id)) or {}):
            break
        time.sleep(POLL_S)
    return m


def controller_seconds(sd: SweepDir, m: Manifest, sched: Scheduler) -> float | None:
    """The controllers' allocations so far (sacct ElapsedRaw; the running one's time so far)."""
    total, seen = 0.0, False
    for job_id in all_controllers(sd):
        allocs = sched.allocations(job_id, controller_job_name(m.sweep_id))
        if allocs:
            seen = True
            total += sum(a.elapsed_s for a in allocs)
    return total if seen else None


def advance(sweep_dir: Path, k: int, sched: Scheduler | None = None, wait: bool = True) -> str:
    """The controller after round k: what it did (one line, also logged)."""
    sd = SweepDir(sweep_dir)
    m = Manifest.read(sweep_dir)
    sched = sched or scheduler_for(m.launcher)
    if wait and not (stopped(sd) or Ended.read(sd)):
        m = _round_points_final(sd, sched)
    with round_lock(sd):
        if stopped(sd):
            return _say(f"round {k}: the rounds were stopped (qualify cancel): nothing submitted")
        if (done := Ended.read(sd)) is not None:
            return _say(f"round {k}: the rounds ended already ({done.why})")
        nxt = RoundMarker.read(sd, k + 1)
        if nxt is not None:  # a controller before this one planned it: finish it, never twice
            complete(sd, nxt, sched)
            return _say(f"round {k + 1} was planned already: its submission is complete")
        mine = RoundMarker.read(sd, k)
        st = AdaptiveState.read(sd)
        if mine is None or st is None:
            raise RuntimeError(f"{sd.adaptive}: no marker of round {k} or no state.json")
        m = Manifest.read(sweep_dir)
        d = A.decide(m, mine.contenders, st.max_repeats, k)
        if not d.repeat:
            return _end(sd, m, k, d, st, sched)
        planned = Manifest.read(sweep_dir)  # in memory only: the ids the round will have
        ids = [e.point_id for _, e in A.add_points(planned, sd.path, d.repeat)]
        later = RoundMarker(k + 1, d.repeat, d.contenders, ids)
        later.write(sd)  # before anything of the round is submitted
        complete(sd, later, sched)
        return _say(A.round_line(k + 1, d.repeat))


def _end(sd: SweepDir, m: Manifest, k: int, d: A.Decision, st: AdaptiveState, sched: Scheduler) -> str:
    r = A.ended(d, k, st.candidates, st.max_repeats)
    seconds = controller_seconds(sd, m, sched)
    overhead = (
        f"; controllers {seconds:.0f} s on {st.partition} (the qualification's overhead, billed to no candidate)"
        if seconds is not None
        else ""
    )
    line = A.rounds_line(r) + overhead
    Ended(r.rounds, r.why, r.contenders, r.gpu_hours, r.full_grid_gpu_hours, seconds, line).write(sd)
    tags = {K.TAG_ADAPTIVE_ENDED: r.why, K.TAG_ADAPTIVE_ROUNDS: str(r.rounds)}
    if seconds is not None:
        tags[K.TAG_ADAPTIVE_CONTROLLER_S] = f"{seconds:.0f}"
    A.tag_parent(m, sd.path, tags, reopen=False)
    close_if_done(sd.path, by=f"adaptive controller (round {k})")
    return _say(line)


def _say(line: str) -> str:
    log.info("%s", line)
    print(line, flush=True)
    return line


# --- the login node's side: cancel, resume, status -------------------------------------------


def is_adaptive(sweep_dir: Path) -> bool:
    return AdaptiveState.read(SweepDir(sweep_dir)) is not None


def stop(sweep_dir: Path, sched: Scheduler, by: str) -> list[str]:
    """`qualify cancel`: no round is submitted any more (stopped.json, under the lock: a
    controller submitting now finishes first), then every controller and held orphan of the
    sweep that Slurm holds is cancelled; their ids. The points are the caller's."""
    from pipeline.files import write_json

    sd = SweepDir(sweep_dir)
    m = Manifest.read(sweep_dir)
    with round_lock(sd):
        write_json(sd.adaptive_stopped, {"by": by, "time": time.time()})
        ids = all_controllers(sd)
        states = sched.job_states(ids, job_name=controller_job_name(m.sweep_id))
        if states is None:
            raise SchedulerError("Slurm did not answer sacct or squeue: nothing was cancelled")
        live = [j for j in ids if (s := states.get(j)) is not None and s.in_slurm]
        named = sched.jobs_named(controller_job_name(m.sweep_id)) or {}
        live += [j for j in named if j not in live]
        known = {j.split("_", 1)[0] for j in (e.job_id for e in m.points) if j}
        orphans = [
            j for j, s in (sched.jobs_named(sweep_job_name(m.sweep_id)) or {}).items()
            if s.held and j.split("_", 1)[0] not in known
        ]  # fmt: skip
        if live or orphans:
            sched.cancel([*live, *orphans])
    return live + orphans


def resume_rounds(sweep_dir: Path, sched: Scheduler) -> str | None:
    """`qualify resume` of an adaptive Slurm sweep whose rounds have not ended: the stop goes,
    a round whose submission did not finish is completed, and where the last round's controller
    is gone (cancelled, failed, timed out) a new one is queued after the round's jobs still in
    Slurm (the points resume just submitted again among them). What was done, or None."""
    sd = SweepDir(sweep_dir)
    if not is_adaptive(sweep_dir) or Ended.read(sd) is not None:
        return None
    m = Manifest.read(sweep_dir)
    with round_lock(sd):
        sd.adaptive_stopped.unlink(missing_ok=True)
        found = markers(sd)
        if not found:
            return None
        last = found[-1]
        if not last.submitted:
            complete(sd, last, sched)
            return f"round {last.round}: its submission is complete (controller {last.controllers[-1]})"
        ctl = last.controllers[-1]
        states = sched.job_states([ctl], job_name=controller_job_name(m.sweep_id))
        if states is None:
            raise SchedulerError("Slurm did not answer sacct or squeue: nothing was submitted")
        js = states.get(ctl)
        if js is not None and (js.in_slurm or js.state not in CONTROLLER_ENDED_BADLY):
            return None  # it waits, runs, or did its work
        job_id = submit_controller(sd, last, sched)
        was = js.state if js is not None else "not known to Slurm"
        return f"round {last.round}: its controller {ctl} ended {was}; queued controller {job_id}"


class RoundsState(StrEnum):
    """Where an adaptive Slurm sweep's rounds stand."""

    GOING_ON = "going on"  # a controller waits or runs
    ENDED = "ended"
    STOPPED = "stopped"  # qualify cancel
    STALLED = "stalled"  # a cut submission or a controller that ended badly: qualify resume


def rounds_state(sweep_dir: Path, sched: Scheduler) -> RoundsState:
    sd = SweepDir(sweep_dir)
    found = markers(sd)
    if Ended.read(sd) is not None:
        return RoundsState.ENDED
    if stopped(sd) is not None:
        return RoundsState.STOPPED
    if not found or not found[-1].submitted:
        return RoundsState.STALLED
    ctl = found[-1].controllers[-1]
    js = (sched.job_states([ctl], job_name=controller_job_name(Manifest.read(sweep_dir).sweep_id)) or {}).get(
        ctl
    )
    bad = js is not None and not js.in_slurm and js.state in CONTROLLER_ENDED_BADLY
    return RoundsState.STALLED if bad else RoundsState.GOING_ON


def status_lines(sweep_dir: Path, sched: Scheduler) -> list[str]:
    """`qualify status`: the round (k of at most N), who is in contention and why, the
    controller and its state (one that ended badly is named, with what recovers it)."""
    sd = SweepDir(sweep_dir)
    st = AdaptiveState.read(sd)
    found = markers(sd)
    if st is None or not found:
        return []
    last = found[-1]
    done = Ended.read(sd)
    if done is not None:
        return [f"adaptive: ended after round {done.rounds} of at most {st.max_repeats}: {done.line}"]
    m = Manifest.read(sweep_dir)
    least = config_from_yaml(PointDir(m.points[0].point_dir).config.read_text()).sweep.min_repeats
    if last.round == 1:
        reason = "round 1: every candidate"
    elif last.round <= least:
        reason = f"every candidate until it has sweep.min_repeats={least} runs; repeated now: {', '.join(last.chosen)}"
    else:
        reason = f"their step-time interval overlaps the best's; repeated now: {', '.join(last.chosen)}"
    lines = [
        f"adaptive: round {last.round} of at most {st.max_repeats}; in contention: {', '.join(last.contenders)} ({reason})"
    ]
    if (why := stopped(sd)) is not None:
        lines.append(
            f"adaptive: stopped by {why.get('by', 'qualify cancel')}; `qualify resume` continues the rounds"
        )
        return lines
    if not last.submitted:
        lines.append(
            f"adaptive: round {last.round}'s submission did not finish; `qualify resume` completes it"
        )
        return lines
    ctl = last.controllers[-1]
    js = (sched.job_states([ctl], job_name=controller_job_name(m.sweep_id)) or {}).get(ctl)
    state = js.state if js is not None else "not yet known to Slurm"
    if js is not None and not js.in_slurm and js.state in CONTROLLER_ENDED_BADLY:
        lines.append(
            f"adaptive: controller {ctl} (after round {last.round}) ended {js.state}: the rounds stopped; "
            f"`qualify resume` queues it again (its log: {sd.controller_log(last.round)})"
        )
    else:
        lines.append(f"adaptive: controller {ctl} decides after round {last.round}: {state}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m pipeline.submit.controller <sweep folder> <round>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store.bound_http_requests()
    log.info("controller of round %s of %s (job %s)", args[1], args[0], os.environ.get("SLURM_JOB_ID", "-"))
    advance(Path(args[0]), int(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
