"""sweep.adaptive on Slurm: the controller's rounds on a fake scheduler that implements the
Scheduler protocol (no Slurm, no job runs: each round's points "end" by writing what their jobs
would have). Round decisions, markers, exactly-once submission after a controller killed mid-
submit or run twice, cancel (the controller included), resume, status."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.contract.pointdir import PointDir
from pipeline.contract.sweepdir import SweepDir
from pipeline.sched import (
    Allocation,
    JobIdentity,
    JobState,
    LauncherKind,
    OneTaskJob,
    Scheduler,
    SchedulerError,
)
from pipeline.slurm.cluster import StartEstimate
from pipeline.submit import adaptive as A
from pipeline.submit import controller as C
from pipeline.submit import sweep as S
from pipeline.submit.manifest import Manifest
from pipeline.submit.rounds import Ended, RoundMarker, markers
from tests.support.adaptive_points import fake_point, record

MEANS = {"zero1": 0.100, "zero2": 0.1001, "zero3": 0.300}  # two close, one clearly slower


class Killed(BaseException):
    """The controller's process killed at this point (scancel, a node lost)."""


@dataclass
class FakeJob:
    name: str
    held: bool
    state: str = "PENDING"
    after: tuple[str, ...] = ()
    kind: str = "array"


@dataclass
class FakeScheduler:
    """The Scheduler protocol over an in-memory queue: ids 100, 101, ...; array tasks 'id_i'."""

    jobs: dict[str, FakeJob] = field(default_factory=dict)
    kill_at: str = ""  # "controller": die after sbatch queued a controller, before its id is recorded
    kind: LauncherKind = LauncherKind.SLURM
    keeps_jobs: bool = True
    runs_setup: bool = True
    _ids: Any = field(default_factory=lambda: itertools.count(100))

    def job_states(self, job_ids: Iterable[str], job_name: str | None = None) -> dict[str, JobState] | None:
        out = {}
        for j in job_ids:
            if j in self.jobs:
                job = self.jobs[j]
                live = job.state in ("PENDING", "RUNNING")
                out[j] = JobState(job.state, None if live else 60.0, live, held=job.held and live)
        return out

    def cancel(self, job_ids: Iterable[str], best_effort: bool = False) -> None:
        for j in job_ids:
            if self.jobs.get(j) and self.jobs[j].state in ("PENDING", "RUNNING"):
                self.jobs[j].state = "CANCELLED"

    def allocations(self, job_id: str, job_name: str | None = None) -> list[Allocation] | None:
        job = self.jobs.get(job_id)
        if job is None or job.kind != "controller" or job.state == "PENDING":
            return None
        return [Allocation(elapsed_s=30.0, gpus=None, start="2026-01-01T00:00:00", state=job.state)]

    def submit_job(self, job: OneTaskJob) -> str:
        job_id = str(next(self._ids))
        self.jobs[job_id] = FakeJob(job.name, job.hold, after=job.after, kind="controller")
        if self.kill_at == "controller":
            self.kill_at = ""
            raise Killed
        return job_id

    def release(self, job_ids: Iterable[str]) -> None:
        for j in job_ids:
            self.jobs[j].held = False

    def jobs_named(self, name: str) -> dict[str, JobState] | None:
        live = {j: s for j, s in (self.job_states(list(self.jobs)) or {}).items() if s.live}
        return {j: s for j, s in live.items() if self.jobs[j].name == name}

    def max_array_size(self) -> int:
        return 1001

    def start_estimate(
        self, partition: str, nodes: int, gpus_per_node: int, time_limit_min: int
    ) -> StartEstimate:
        return StartEstimate(datetime.now().astimezone(), refused="fake")

    def this_job(self, env: Mapping[str, str] | None = None) -> JobIdentity | None:
        return None

    def requeue_self(self, job: JobIdentity | None, timeout_s: float) -> None:
        pass

    def preempt_self(self, trigger: str, job: JobIdentity | None, timeout_s: float) -> str:
        raise SchedulerError("fake")

    # what the test drives: arrays queued by _submit_slurm, jobs ending
    def queue_array(self, name: str, n: int, held: bool) -> list[str]:
        base = str(next(self._ids))
        ids = [f"{base}_{i}" for i in range(n)]
        for j in ids:
            self.jobs[j] = FakeJob(name, held)
        return ids

    def live(self) -> list[str]:
        return [j for j, job in self.jobs.items() if job.state in ("PENDING", "RUNNING")]

    def controllers(self) -> list[str]:
        return [j for j, job in self.jobs.items() if job.kind == "controller"]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeScheduler:
    sched = FakeScheduler()
    _protocol: Scheduler = sched  # mypy checks that the fake implements the protocol exactly
    arrays: list[list[str]] = []

    def submit_slurm(
        pl: Any, pairs: Any, folder: Any, parent: Any, hold: bool = False, whole_sweep: bool = True
    ) -> None:
        ids = sched.queue_array(f"sq-{pl.manifest.sweep_id}", len(pairs), hold)
        arrays.append(ids)
        if sched.kill_at == "array":  # sbatch queued the array; the controller died before the record
            sched.kill_at = ""
            raise Killed
        for (_, entry), j in zip(pairs, ids, strict=True):
            entry.job_id, entry.group = j, "fake"

    monkeypatch.setattr(S, "_submit_slurm", submit_slurm)
    monkeypatch.setattr(A, "tag_parent", lambda *a, **k: None)
    monkeypatch.setattr(C, "parent_tracker", lambda *a, **k: SimpleNamespace(close=lambda **_: None))
    monkeypatch.setattr(C, "close_if_done", lambda *a, **k: False)
    sched.arrays = arrays  # type: ignore[attr-defined]
    return sched


def slurm_sweep(tmp_path: Path, sched: FakeScheduler, most: int = 3) -> Path:
    """Round 1 of three candidates queued (as `qualify sweep` leaves it), then `begin`."""
    sweep_dir = tmp_path / "sweep"
    m = Manifest("s1", "smoke", "now", "slurm", "", "e", ["sweep.adaptive=true"], submitted=True)
    ids = sched.queue_array("sq-s1", len(MEANS), held=False)
    for i, (par, mean) in enumerate(MEANS.items()):
        entry = fake_point(sweep_dir, i, par, 1, mean, 0.1)
        PointDir(entry.point_dir).clear_outcome()  # queued, not run yet
        entry.job_id = ids[i]
        m.points.append(entry)
    m.write(sweep_dir)
    points = [SimpleNamespace(cfg=_cfg(PointDir(e.point_dir))) for e in m.points]
    C.begin(sweep_dir, points, most, sched)
    return sweep_dir


def _cfg(point: PointDir) -> Any:
    from pipeline.config.resolved import config_from_yaml

    cfg = config_from_yaml(point.config.read_text())
    cfg.partition.slurm_partition = "cpu"
    return cfg


def run_round(sweep_dir: Path, sched: FakeScheduler) -> None:
    """Every queued point of the sweep runs and ends accepted, at its candidate's step time."""
    m = Manifest.read(sweep_dir)
    for e in m.points:
        point = PointDir(e.point_dir)
        if point.read_outcome() is None:
            assert e.job_id and not sched.jobs[e.job_id].held, f"{e.point_id} ran while held or unqueued"
            par = next(p for p in MEANS if p in e.candidate)
            seed = int(e.overrides[-1].rpartition("=")[2])
            record(point, MEANS[par], 0.1, seed)
            sched.jobs[e.job_id].state = "COMPLETED"


def run_controller(sweep_dir: Path, sched: FakeScheduler) -> str:
    """The pending controller starts (its dependency met) and runs to its end."""
    mk = markers(SweepDir(sweep_dir))[-1]
    ctl = mk.controllers[-1]
    assert not sched.jobs[ctl].held and all(sched.jobs[j].state == "COMPLETED" for j in sched.jobs[ctl].after)
    sched.jobs[ctl].state = "RUNNING"
    line = C.advance(sweep_dir, mk.round, sched, wait=False)
    sched.jobs[ctl].state = "COMPLETED"
    return line


def test_round_one_is_followed_by_a_released_controller_after_its_arrays(
    tmp_path: Path, fake: FakeScheduler
) -> None:
    sweep_dir = slurm_sweep(tmp_path, fake)
    first = RoundMarker.read(SweepDir(sweep_dir), 1)
    assert first is not None and first.submitted and len(first.point_ids) == 3
    (ctl,) = fake.controllers()
    assert first.controllers == [ctl] and not fake.jobs[ctl].held
    assert set(fake.jobs[ctl].after) == {e.job_id for e in Manifest.read(sweep_dir).points}
    assert fake.jobs[ctl].name == "sq-s1-ctl"


def test_rounds_repeat_only_the_contenders_until_the_most_repeats(
    tmp_path: Path, fake: FakeScheduler
) -> None:
    sweep_dir = slurm_sweep(tmp_path, fake, most=3)
    lines = []
    while Ended.read(SweepDir(sweep_dir)) is None:
        run_round(sweep_dir, fake)
        lines.append(run_controller(sweep_dir, fake))
    sd = SweepDir(sweep_dir)
    found = markers(sd)
    assert [mk.round for mk in found] == [1, 2, 3]
    # zero3 (3x slower) is out after round 1; the two close ones get a repeat each round
    assert all(sorted(mk.chosen) == sorted(found[1].chosen) and len(mk.chosen) == 2 for mk in found[1:])
    assert not any("zero3" in c for c in found[1].chosen)
    m = Manifest.read(sweep_dir)
    assert [e.index for e in m.points] == list(range(7)) and len({e.point_id for e in m.points}) == 7
    assert len(fake.arrays) == 2  # rounds 2 and 3 (round 1 is the test's own), each once
    done = Ended.read(sd)
    assert done is not None and done.rounds == 3 and "3 repeats each" in done.why
    # each run 0.1 GPU-hour: 7 spent; the full grid 3 candidates x 3 repeats = 9
    assert done.gpu_hours == pytest.approx(0.7) and done.full_grid_gpu_hours == pytest.approx(0.9)
    assert done.controller_s == pytest.approx(3 * 30.0)  # three controllers, billed to no candidate
    assert "billed to no candidate" in done.line and fake.live() == []
    assert "ended after round 3 of at most 3" in C.status_lines(sweep_dir, fake)[0]


def test_a_controller_run_twice_submits_nothing_twice(tmp_path: Path, fake: FakeScheduler) -> None:
    sweep_dir = slurm_sweep(tmp_path, fake)
    run_round(sweep_dir, fake)
    run_controller(sweep_dir, fake)
    before = (len(fake.arrays), len(fake.controllers()), len(Manifest.read(sweep_dir).points))
    C.advance(sweep_dir, 1, fake, wait=False)  # requeued, or a duplicate: round 2's marker is complete
    assert (len(fake.arrays), len(fake.controllers()), len(Manifest.read(sweep_dir).points)) == before


@pytest.mark.parametrize("kill_at", ["array", "controller"])
def test_a_controller_killed_mid_submit_then_resumed_submits_the_round_once(
    tmp_path: Path, fake: FakeScheduler, kill_at: str
) -> None:
    sweep_dir = slurm_sweep(tmp_path, fake)
    run_round(sweep_dir, fake)
    fake.kill_at = kill_at
    with pytest.raises(Killed):
        run_controller(sweep_dir, fake)
    fake.jobs[markers(SweepDir(sweep_dir))[0].controllers[-1]].state = "CANCELLED"  # scancel killed it
    sd = SweepDir(sweep_dir)
    cut = RoundMarker.read(sd, 2)
    assert cut is not None and not cut.submitted  # the intent was recorded before sbatch
    held = [j for j in fake.live() if fake.jobs[j].held]
    assert held, "the cut submission left its held jobs"
    status = C.status_lines(sweep_dir, fake)
    assert "round 2 of at most 3" in status[0] and "did not finish" in status[1], status
    said = C.resume_rounds(sweep_dir, fake)
    assert said is not None and "submission is complete" in said
    done = RoundMarker.read(sd, 2)
    assert done is not None and done.submitted
    assert all(fake.jobs[j].state == "CANCELLED" for j in held)  # the orphans never ran
    live_points = [j for j in fake.live() if fake.jobs[j].kind == "array"]
    assert sorted(live_points) == sorted(done.job_ids) and len(done.job_ids) == 2
    assert [j for j in fake.live() if fake.jobs[j].kind == "controller"] == done.controllers[-1:]
    m = Manifest.read(sweep_dir)
    assert len(m.points) == 5 and {e.job_id for e in m.points[3:]} == set(done.job_ids)
    assert C.resume_rounds(sweep_dir, fake) is None  # once more: nothing to do
    assert len([j for j in fake.jobs if fake.jobs[j].kind == "array"]) == 3 + 2 + (
        2 if kill_at == "array" else 0
    )


def test_points_of_a_cut_round_that_resume_ran_are_adopted_not_submitted_again(
    tmp_path: Path, fake: FakeScheduler
) -> None:
    sweep_dir = slurm_sweep(tmp_path, fake)
    run_round(sweep_dir, fake)
    fake.kill_at = "array"
    with pytest.raises(Killed):
        run_controller(sweep_dir, fake)  # round 2's points are in the manifest, without jobs
    C.stop(sweep_dir, fake, by="qualify cancel")  # cancels the held orphans too
    assert fake.live() == []  # the killed controller and the held orphans
    m = Manifest.read(sweep_dir)
    for e in m.points[3:]:  # what cancel then resume do to them: ended cancelled, run again
        assert e.job_id == ""
        e.job_id = fake.queue_array("sq-s1", 1, held=False)[0]
    m.write(sweep_dir)
    C.resume_rounds(sweep_dir, fake)
    cut = RoundMarker.read(SweepDir(sweep_dir), 2)
    assert cut is not None and cut.submitted and cut.job_ids == [e.job_id for e in m.points[3:]]
    assert len(fake.arrays) == 1  # the cut one only: round 2 was not submitted again


def test_cancel_stops_the_rounds_and_resume_goes_on_from_the_last_round(
    tmp_path: Path, fake: FakeScheduler
) -> None:
    sweep_dir = slurm_sweep(tmp_path, fake)
    run_round(sweep_dir, fake)
    run_controller(sweep_dir, fake)  # round 2 queued, its controller pending
    pending = markers(SweepDir(sweep_dir))[-1].controllers[-1]
    cancelled = C.stop(sweep_dir, fake, by="qualify cancel")
    assert pending in cancelled and fake.jobs[pending].state == "CANCELLED"
    fake.cancel(fake.live())  # control.cancel_sweep's part: the points
    assert fake.live() == []
    assert "stopped by qualify cancel" in C.status_lines(sweep_dir, fake)[1]
    assert "nothing submitted" in C.advance(sweep_dir, 2, fake, wait=False)  # a straggling controller
    # resume: the cancelled points run again (sweep.resume), then the rounds' controller is back
    m = Manifest.read(sweep_dir)
    for e in m.points[3:]:
        e.job_id = fake.queue_array("sq-s1", 1, held=False)[0]
    m.write(sweep_dir)
    said = C.resume_rounds(sweep_dir, fake)
    assert said is not None and f"controller {pending} ended CANCELLED" in said
    new = markers(SweepDir(sweep_dir))[-1].controllers[-1]
    assert set(fake.jobs[new].after) == {e.job_id for e in m.points[3:]}
    assert C.resume_rounds(sweep_dir, fake) is None  # its controller waits: nothing more
    run_round(sweep_dir, fake)
    run_controller(sweep_dir, fake)
    assert len(fake.arrays) == 2  # rounds 2 and 3 once each; round 1 never again


def test_a_failed_controller_is_shown_and_resume_queues_it_again(tmp_path: Path, fake: FakeScheduler) -> None:
    sweep_dir = slurm_sweep(tmp_path, fake)
    run_round(sweep_dir, fake)
    (ctl,) = fake.controllers()
    fake.jobs[ctl].state = "TIMEOUT"
    lines = C.status_lines(sweep_dir, fake)
    assert f"controller {ctl} (after round 1) ended TIMEOUT" in lines[1] and "qualify resume" in lines[1]
    assert C.rounds_state(sweep_dir, fake) == C.RoundsState.STALLED
    said = C.resume_rounds(sweep_dir, fake)
    assert said is not None and "queued controller" in said
    assert "decides after round 1: PENDING" in C.status_lines(sweep_dir, fake)[1]
    assert C.rounds_state(sweep_dir, fake) == C.RoundsState.GOING_ON


def test_the_controller_partition_is_named_or_the_cheapest() -> None:
    def point(name: str, price: float | None, named: str | None = None) -> Any:
        part = SimpleNamespace(slurm_partition=name, price_usd_per_gpu_hour=price)
        sweep = SimpleNamespace(controller_partition=named)
        return SimpleNamespace(cfg=SimpleNamespace(partition=part, sweep=sweep))

    assert C.controller_partition([point("h100", 3.0), point("a100", 1.5), point("cpu", None)]) == "a100"
    assert C.controller_partition([point("h100", 3.0, named="debug")]) == "debug"
