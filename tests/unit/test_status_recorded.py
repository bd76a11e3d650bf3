"""Status and cancel without a cluster: recorded `sacct`/`squeue`/`scancel` answers, in the
exact formats the commands are asked for, stand in for the client commands at the one place
they are started (pipeline.slurm.commands.execute), as submitit's tests do with their
MockedSubprocess. The same logic against the live local Slurm is in test_slurm_sweep.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from pipeline import cli
from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.parent import close_if_done
from pipeline.contract.parent import closed as parent_closed
from pipeline.contract.parent import summary as parent_summary
from pipeline.contract.pointdir import PointDir
from pipeline.slurm import commands
from pipeline.slurm.cluster import JobState, job_states, max_array_size
from pipeline.submit.manifest import Manifest, PointEntry
from pipeline.submit.status import (
    LOST_GRACE_S,
    MIN_QUERY_INTERVAL_S,
    REQUEUE_WAIT_S,
    STATUS_CACHE,
    point_states,
    status_table,
)
from pipeline.tracking import keys as K
from tests.support.recorded_slurm import (
    NAME,
    SWEEP_ID,
    RecordedSlurm,
    ended,
    make_sweep,
    outcome,
    sacct,
    squeue,
)


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> RecordedSlurm:
    recorded = RecordedSlurm()
    monkeypatch.setattr(commands, "execute", recorded)
    return recorded


def age_cache(sweep_dir: Path, seconds: float) -> None:
    """Make the sweep's shared Slurm answer `seconds` older."""
    cache = sweep_dir / STATUS_CACHE
    data = json.loads(cache.read_text())
    data["time"] -= seconds
    cache.write_text(json.dumps(data))


def test_job_states_from_sacct_and_squeue(slurm: RecordedSlurm) -> None:
    """Array tasks one per line or as a pending range; squeue (live) over sacct; rows of another
    sweep's job with a reused id ignored; ids Slurm does not know absent."""
    slurm.answers["sacct"] = (
        sacct(
            ("12_0", "COMPLETED", ended(600)),
            ("12_1", "RUNNING", "Unknown"),
            ("12_[2-4%2]", "PENDING", "Unknown"),
            ("13", "OUT_OF_MEMORY", ended(30)),
        )
        + "12_5|sq-another-sweep|FAILED|2026-01-01T00:00:00\n"
    )
    slurm.answers["squeue"] = squeue(("12_1", "COMPLETING"), ("12_2", "PENDING"))
    states = job_states(["12_0", "12_1", "12_2", "12_3", "12_4", "12_5", "13", "99"], job_name=NAME)

    assert slurm.calls == [
        ["sacct", "-X", "-n", "-P", "-o", "JobID,JobName%200,State,End,Eligible,Start", "-j", "12,13,99"],
        ["squeue", "-h", "-r", "-o", "%i|%j|%T", "-j", "12,13,99"],
    ]
    assert set(states) == {"12_0", "12_1", "12_2", "12_3", "12_4", "13"}
    assert states["12_0"].state == "COMPLETED" and 590 < (states["12_0"].ended_s_ago or 0) < 700
    assert states["12_1"] == JobState("COMPLETING", None, live=True)
    assert states["12_2"] == JobState("PENDING", None, live=True)
    assert states["12_3"] == states["12_4"] == JobState("PENDING", None, live=False)
    assert states["13"].state == "OUT_OF_MEMORY" and 20 < (states["13"].ended_s_ago or 0) < 120


@pytest.mark.parametrize("problem", ["hangs", "fails"])
def test_job_states_when_sacct_does_not_answer(slurm: RecordedSlurm, problem: str) -> None:
    if problem == "hangs":
        slurm.hangs.add("sacct")
    else:
        slurm.fails["sacct"] = "sacct: error: Problem talking to the database: Connection refused"
    slurm.answers["squeue"] = squeue(("12_1", "RUNNING"))
    assert job_states(["12_0", "12_1"], job_name=NAME) == {"12_1": JobState("RUNNING", None, live=True)}
    slurm.hangs.add("squeue")
    assert job_states(["12_0", "12_1"], job_name=NAME) == {}  # nothing known: nothing guessed


def test_point_states_of_a_sweep(slurm: RecordedSlurm, tmp_path: Path) -> None:
    """Pending, running, ended with an outcome, ended without one after the grace period
    (recorded lost, with the reason its Slurm state gives), ended a moment ago (not yet)."""
    jobs = ["12_0", "12_1", "12_2", "12_3", "12_4", "12_5", "13"]
    sweep_dir, m = make_sweep(tmp_path, jobs)
    p = m.points
    accepted = outcome(p[0], Outcome.ACCEPTED)
    failed = outcome(p[5], Outcome.FAILED, Reason.OOM)
    slurm.answers["sacct"] = sacct(
        ("12_0", "COMPLETED", ended(900)),
        ("12_[1-2]", "PENDING", "Unknown"),
        ("12_3", "TIMEOUT", ended(300)),
        ("12_4", "CANCELLED by 0", ended(LOST_GRACE_S / 5)),
        ("12_5", "OUT_OF_MEMORY", ended(900)),
        ("13", "NODE_FAIL", ended(120)),
    )
    slurm.answers["squeue"] = squeue(("12_1", "RUNNING"), ("12_2", "PENDING"))

    states = {s.entry.point_id: s for s in point_states(m)}
    assert {k: s.state for k, s in states.items()} == {
        "p0000": "accepted",  # its outcome, whatever Slurm says
        "p0001": "running",
        "p0002": "pending",
        "p0003": "failed",  # ended 5 min ago without an outcome: lost
        "p0004": "running",  # ended a moment ago: its outcome may still reach the disk
        "p0005": "failed",
        "p0006": "failed",
    }
    assert states["p0000"].outcome == accepted and states["p0005"].outcome == failed
    assert PointDir(p[0].point_dir).read_outcome() == accepted, "an outcome is never overwritten"
    for i, job, state, reason in (
        (3, "12_3", "TIMEOUT", Reason.TIMEOUT),
        (6, "13", "NODE_FAIL", Reason.CRASH),
    ):
        written = PointDir(p[i].point_dir).read_outcome()
        assert written is not None and written == states[p[i].point_id].outcome
        assert (written["outcome"], written["reason"]) == (Outcome.FAILED, reason)
        assert written["detail"] == f"Slurm job {job} ended {state} without an outcome"
    assert PointDir(p[4].point_dir).read_outcome() is None
    assert slurm.programs() == ["sacct", "squeue"], "one sacct and one squeue call for the whole sweep"


def test_point_states_when_slurm_does_not_answer(slurm: RecordedSlurm, tmp_path: Path) -> None:
    """Nothing is recorded lost on a silence: points without an outcome stay pending."""
    _, m = make_sweep(tmp_path, ["12_0", "12_1"])
    outcome(m.points[0], Outcome.ACCEPTED)
    slurm.hangs |= {"sacct", "squeue"}
    assert [s.state for s in point_states(m)] == ["accepted", "pending"]
    assert PointDir(m.points[1].point_dir).read_outcome() is None


def test_cancel_sends_one_scancel_and_survives_its_failure(slurm: RecordedSlurm) -> None:
    slurm.answers["scancel"] = ""
    commands.cancel(["12_1", "", "13", "12_1", "12_0"])
    assert slurm.calls == [["scancel", "12_0", "12_1", "13"]]
    commands.cancel([""])
    assert len(slurm.calls) == 1, "nothing to cancel: no call"
    slurm.fails["scancel"] = "scancel: error: Kill job error on job id 13: Invalid job id specified"
    commands.cancel(["13"])  # bounded, errors ignored
    slurm.hangs.add("scancel")
    commands.cancel(["13"])
    assert slurm.calls[1:] == [["scancel", "13"], ["scancel", "13"]]


def test_qualify_status_in_process(
    slurm: RecordedSlurm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`qualify status` over recorded answers: the table while points run, then the summary
    once every point has ended, and the parent run closed once."""
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1"])
    outcome(m.points[0], Outcome.ACCEPTED)
    slurm.answers["sacct"] = sacct(("12_1", "RUNNING", "Unknown"))
    slurm.answers["squeue"] = squeue(("12_1", "RUNNING"))
    argv = ["status", "--runs-dir", str(tmp_path / "runs")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"sweep {SWEEP_ID} (smoke, slurm): 2 points" in out
    assert "all     [############............] 1/2" in out
    assert "outcome" not in out, "no summary while a point runs"
    assert not (sweep_dir / ".parent_closed").exists()

    assert slurm.programs() == ["sacct", "squeue"]
    slurm.answers["sacct"] = sacct(("12_1", "FAILED", ended(60)))
    slurm.answers["squeue"] = ""
    assert cli.main([*argv, "--sweep", SWEEP_ID]) == 0
    assert "all     [############............] 1/2" in capsys.readouterr().out
    assert slurm.programs() == ["sacct", "squeue"], "a poll within 5 s reuses the sweep's cached answer"
    age_cache(sweep_dir, MIN_QUERY_INTERVAL_S + 1)
    assert cli.main([*argv, "--sweep", SWEEP_ID]) == 0
    out = capsys.readouterr().out
    assert "all     [########################] 2/2" in out
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("p000")}
    assert lines["p0000"][1] == "accepted" and lines["p0001"][1:3] == ["failed", Reason.CRASH]
    assert (sweep_dir / ".parent_closed").exists()


def test_qualify_status_of_an_unknown_sweep_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["status", "--runs-dir", str(tmp_path), "--sweep", "nope"]) == 2
    assert capsys.readouterr().err.strip() == f"error: no sweep 'nope' under {tmp_path}"


def stopped(entry: PointEntry, seconds_ago: float, attempts: int = 1) -> None:
    """The job's own records of `attempts` attempts that stopped to be requeued, the last one
    `seconds_ago` (attempts.json, restart.json: what the job writes as it requeues itself)."""
    point = PointDir(entry.point_dir).create()
    t = time.time() - seconds_ago
    for a in range(attempts):
        point.append_attempt({"start": t - 30 - a, "end": t, "stop": "preempt"})
    point.write_stop(
        {"reason": "preempt", "signal_time": t - 1, "exit_time": t, "stop_step": 3, "saved_step": 3}
    )


def test_a_point_between_attempts_is_requeued_never_failed(slurm: RecordedSlurm, tmp_path: Path) -> None:
    """Every form a requeue takes in Slurm's answers: squeue lists it pending again; sacct's
    latest record is REQUEUED or PENDING; the old record reads FAILED/PREEMPTED (ended a minute
    ago) while the job's own stop record says it asked to run again at that end. None is lost;
    a job that stopped long before its FAILED record ended is."""
    jobs = ["12_0", "12_1", "12_2", "12_3", "12_4", "12_5", "12_6"]
    _, m = make_sweep(tmp_path, jobs)
    p = m.points
    for i in (0, 1, 2, 3, 4):
        stopped(p[i], 60, attempts=1 + i % 2)
    stopped(p[5], 30)
    stopped(p[6], 2 * REQUEUE_WAIT_S)
    slurm.answers["sacct"] = sacct(
        ("12_0", "REQUEUED", ended(59)),
        ("12_1", "PENDING", "Unknown"),
        ("12_2", "FAILED", ended(58)),
        ("12_3", "PREEMPTED", ended(60)),
        ("12_4", "RUNNING", "Unknown"),
        ("12_5", "FAILED", ended(29)),
        ("12_6", "FAILED", ended(2 * REQUEUE_WAIT_S - 1)),
    )
    slurm.answers["squeue"] = squeue(("12_1", "PENDING"), ("12_4", "RUNNING"), ("12_5", "REQUEUE_HOLD"))
    states = point_states(m)
    assert [(s.state, s.attempts) for s in states] == [
        ("requeued", 1),
        ("requeued", 2),
        ("requeued", 1),
        ("requeued", 2),
        ("running", 1),
        ("requeued", 1),
        ("failed", 1),
    ]
    assert all(PointDir(e.point_dir).read_outcome() is None for e in p[:6]), "nothing written for a requeue"
    assert (states[6].outcome or {})["detail"] == "Slurm job 12_6 ended FAILED without an outcome"
    table = status_table(m, states)
    assert "requeued (between attempts): p0000 (attempt 2 next), p0001 (attempt 3 next)" in table
    assert "all     [###.....................] 1/7" in table, "a requeued point is not counted as ended"


def test_parent_run_closes_once_when_the_last_point_has_its_outcome(
    tmp_path: Path, slurm: RecordedSlurm
) -> None:
    """Concurrent closers (the last job, watchers): exactly one closes, only once every point has
    an outcome; its summary counts points by outcome and partition. Slurm answers that the jobs
    ended (recorded: with Slurm silent no closer may close, tested below)."""
    slurm.answers["sacct"] = sacct(*((f"12_{i}", "COMPLETED", ended(5)) for i in range(3)))
    slurm.answers["squeue"] = ""
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1", "12_2"])
    outcome(m.points[0], Outcome.ACCEPTED)
    outcome(m.points[1], Outcome.FAILED, Reason.OOM)
    assert not close_if_done(sweep_dir, by="early")
    outcome(m.points[2], Outcome.ACCEPTED)
    with ThreadPoolExecutor(8) as pool:
        closed_by = list(pool.map(lambda i: close_if_done(sweep_dir, by=f"closer {i}"), range(8)))
    assert sum(closed_by) == 1
    assert parent_closed(sweep_dir)["by"] == f"closer {closed_by.index(True)}"
    pre = K.SWEEP_POINTS_PREFIX
    assert parent_summary([(e.partition, PointDir(e.point_dir).read_outcome() or {}) for e in m.points]) == {
        f"{pre}accepted": 2.0,
        f"{pre}failed": 1.0,
        f"{pre}error": 0.0,
        f"{pre}a100.accepted": 0.0,
        f"{pre}a100.failed": 1.0,
        f"{pre}a100.error": 0.0,
        f"{pre}h100.accepted": 2.0,
        f"{pre}h100.failed": 0.0,
        f"{pre}h100.error": 0.0,
    }
    from collections import Counter

    from pipeline.contract.parent import description

    note = description(SWEEP_ID, parent_summary([("a100", {"outcome": "failed"})]), Counter({"oom": 1}))
    assert note.splitlines()[:3] == [
        f"Sweep `{SWEEP_ID}`: 1 points, 0 accepted, 1 failed.",
        "Failed by reason: oom 1.",
        "- `a100`: 0 accepted, 1 failed",
    ]
    assert "`report/report.md`" in note


def test_the_parent_stays_open_while_slurm_is_silent(tmp_path: Path, slurm: RecordedSlurm) -> None:
    """Every point has an outcome, but neither sacct nor squeue answers: a job may still be
    requeued, so no closer closes the parent run; the next one, with Slurm answering, does."""
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1"])
    for e in m.points:
        outcome(e, Outcome.ACCEPTED)
    slurm.hangs.update({"sacct", "squeue"})
    assert not close_if_done(sweep_dir, by="silent")
    assert parent_closed(sweep_dir) is None
    slurm.hangs.clear()
    slurm.answers["sacct"] = sacct(("12_0", "COMPLETED", ended(5)), ("12_1", "COMPLETED", ended(5)))
    slurm.answers["squeue"] = ""
    assert close_if_done(sweep_dir, by="answered")


def test_an_interrupted_local_sweep_ends_its_points(tmp_path: Path) -> None:
    """The embedded default: a point with no live process while the sweep's process is gone is
    failed (interrupted), its MLflow run KILLED; while the sweep's process lives it is pending."""
    import mlflow

    sweep_dir, m = make_sweep(tmp_path, ["", ""])
    gone = subprocess.Popen(["true"])
    gone.wait()
    m.launcher, m.tracking_uri = "local", f"sqlite:///{tmp_path / 'mlflow.db'}"
    m.points[0].job_id = str(gone.pid)
    m.submit_pid, m.submit_host = os.getpid(), socket.gethostname()
    assert [s.state for s in point_states(m)] == ["pending", "pending"]
    m.submit_pid = gone.pid
    states = point_states(m)
    assert [(s.state, (s.outcome or {}).get("reason")) for s in states] == [
        ("failed", Reason.INTERRUPTED)
    ] * 2
    runs = mlflow.MlflowClient(m.tracking_uri).search_runs(
        [mlflow.MlflowClient(m.tracking_uri).get_experiment_by_name(m.experiment).experiment_id]
    )
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"]
    exp = mlflow.MlflowClient(m.tracking_uri).get_experiment_by_name(m.experiment)
    assert exp.tags[K.EXP_TAG_KIND] == K.EXP_KIND_TRAINING, "the UI opens it on its runs"


def test_max_array_size_from_scontrol_show_config(slurm: RecordedSlurm) -> None:
    slurm.answers["scontrol"] = "MaxArraySize            = 1001\nMaxJobCount             = 10000\n"
    assert max_array_size() == 1001
    assert slurm.calls == [["scontrol", "show", "config"]]
    slurm.answers["scontrol"] = "MaxArraySize = 4\n"
    assert max_array_size() == 4
    slurm.hangs.add("scontrol")
    assert max_array_size() == 1001, "Slurm's default when the controller does not say"


# --- issue #22: a live point is never final, under every interleaving of a requeue ---------------
# Each snapshot: (sacct rows, squeue rows, what the point folder of task 12_1 holds, its state).
# The array is 12 with three tasks; 12_0 runs throughout and 12_2 waits in the array's own record
# ("12_[2]": sacct and squeue list the pending remainder of an array as one range until it splits).
REQUEUE_AFTER_PREEMPT = [
    ([("12_[1-2]", "PENDING", "Unknown")], [("12_[1-2]", "PENDING")], {}, "pending"),
    ([("12_1", "RUNNING", "Unknown")], [("12_1", "RUNNING")], {}, "running"),
    # attempt 1 stopped on the drill's USR2, saved, asked Slurm to requeue it, and exited
    ([("12_1", "REQUEUED", ended(1))], [], {"stop": True}, "requeued"),
    ([("12_1", "PENDING", "Unknown")], [("12_1", "PENDING")], {"stop": True}, "requeued"),
    ([("12_1", "RUNNING", "Unknown")], [("12_1", "RUNNING")], {"stop": True}, "running"),
    # attempt 2 wrote its outcome and is tearing down: still in Slurm, so not final yet
    ([("12_1", "RUNNING", "Unknown")], [("12_1", "COMPLETING")], {"outcome": "accepted"}, "running"),
    ([("12_1", "COMPLETED", ended(1))], [], {"outcome": "accepted"}, "accepted"),
]
CRASHED_THEN_REQUEUED = [
    ([("12_1", "RUNNING", "Unknown")], [("12_1", "RUNNING")], {}, "running"),
    # the first attempt wrote a failed outcome, then Slurm requeued the job (a node failure during
    # teardown, an admin's requeue): pending again, so the point is live, not failed
    ([("12_1", "REQUEUED", ended(1))], [("12_1", "PENDING")], {"outcome": "failed"}, "requeued"),
    ([("12_1", "PENDING", "Unknown")], [("12_1", "PENDING")], {"outcome": "failed"}, "requeued"),
    ([("12_1", "RUNNING", "Unknown")], [("12_1", "RUNNING")], {"outcome": "failed"}, "running"),
    ([("12_1", "COMPLETED", ended(1))], [], {"outcome": "failed"}, "failed"),
]


@pytest.mark.parametrize(
    "snapshots",
    [REQUEUE_AFTER_PREEMPT, CRASHED_THEN_REQUEUED],
    ids=["preempt-requeue", "crashed-then-requeued"],
)
def test_a_live_point_is_never_shown_final(
    tmp_path: Path, slurm: RecordedSlurm, snapshots: list[tuple[list, list, dict, str]]
) -> None:
    """Polled through each moment of a requeue: a point is final only once its job has left
    Slurm and its outcome is on disk, and the progress bar counts only final points."""
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1", "12_2"])
    point = PointDir(m.points[1].point_dir)
    point.create()
    seen = []
    for rows, queued, folder, _expected in snapshots:
        always_running = [("12_0", "RUNNING")]
        split = not any("[" in job for job, _, _ in rows)
        slurm.answers["sacct"] = sacct(*rows, ("12_0", "RUNNING", "Unknown"))
        slurm.answers["squeue"] = squeue(*queued, *always_running, *([("12_2", "PENDING")] if split else []))
        if folder.get("stop"):
            point.write_stop({"reason": "preempt", "exit_time": time.time() - 1})
            if not point.attempts():
                point.append_attempt({"start": 0, "end": time.time() - 1, "stop": "preempt", "ranks": 2})
        if "outcome" in folder and (point.read_outcome() or {}).get("outcome") != folder["outcome"]:
            point.clear_stop()  # as the job ends a point: its attempt record, then its outcome
            point.append_attempt({"start": 0, "end": time.time(), "outcome": folder["outcome"], "ranks": 2})
            outcome(m.points[1], folder["outcome"], "" if folder["outcome"] == "accepted" else Reason.CRASH)
        states = point_states(Manifest.read(sweep_dir))
        got = [s.state for s in states]
        seen.append(got[1])
        assert got[0] == "running" and got[2] == "pending", got
        table = status_table(m, states)
        done = sum(s.state in ("accepted", "failed", "error") for s in states)
        assert f"] {done}/3" in table and done == (got[1] in ("accepted", "failed")), table
    assert seen == [expected for *_, expected in snapshots]


def test_the_last_job_does_not_close_the_parent_while_slurm_will_run_a_point_again(
    tmp_path: Path, slurm: RecordedSlurm
) -> None:
    """Every point has an outcome file, but one job was requeued after it wrote it: the parent
    stays open until that job has left Slurm; the closing job's own id is not waited for."""
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1", "12_2"])
    for entry in m.points:
        outcome(entry, Outcome.ACCEPTED)
    slurm.answers["sacct"] = sacct(("12_0", "COMPLETED", ended(30)), ("12_1", "REQUEUED", ended(2)))
    slurm.answers["squeue"] = squeue(("12_1", "PENDING"), ("12_2", "COMPLETING"))
    assert not close_if_done(sweep_dir, by="job 12_2", own_job="12_2")
    slurm.answers["sacct"] = sacct(("12_0", "COMPLETED", ended(30)), ("12_1", "COMPLETED", ended(1)))
    slurm.answers["squeue"] = squeue(("12_2", "COMPLETING"))
    assert close_if_done(sweep_dir, by="job 12_2", own_job="12_2")
    assert parent_closed(sweep_dir)["by"] == "job 12_2"


def test_the_parent_is_not_closed_by_a_job_when_slurm_does_not_answer(
    tmp_path: Path, slurm: RecordedSlurm
) -> None:
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1"])
    for entry in m.points:
        outcome(entry, Outcome.ACCEPTED)
    slurm.hangs.update({"sacct", "squeue"})
    assert not close_if_done(sweep_dir, by="job 12_1", own_job="12_1")
    assert parent_closed(sweep_dir) is None


def test_a_point_its_killed_sweep_was_submitting_is_never_stopped_while_its_job_may_run(
    tmp_path: Path,
) -> None:
    """Issue 47, case 10: `qualify sweep` SIGKILLed as it submitted its first point (the job
    started, its id not yet in the manifest). While a job of the sweep it never recorded lives,
    that point is unknown ("submitting"), never interrupted, and nothing is written for it (no
    outcome, no KILLED run beside the one its job makes); once its rank 0 writes its pid, it is
    running; the points after it, never started, are interrupted. Once the job is gone without
    an outcome, the point is interrupted too."""
    import mlflow

    sweep_dir, m = make_sweep(tmp_path, ["", "", ""])
    gone = subprocess.Popen(["true"])
    gone.wait()
    m.launcher, m.tracking_uri = "local", f"sqlite:///{tmp_path / 'mlflow.db'}"
    m.submit_pid, m.submit_host = gone.pid, socket.gethostname()
    job = subprocess.Popen(["sleep", "60"])  # the controller submitit started: its pid is the job id
    try:
        (sweep_dir / "submitit").mkdir()
        (sweep_dir / "submitit" / f"{job.pid}_0_log.out").write_text("")
        states = point_states(m)
        assert [s.state for s in states] == ["unknown", "failed", "failed"]
        assert [(s.outcome or {}).get("reason") for s in states[1:]] == [Reason.INTERRUPTED] * 2
        assert PointDir(m.points[0].point_dir).read_outcome() is None, "nothing written for it"
        assert "submitting / unknown" in status_table(m, states) and "p0000" in status_table(m, states)
        PointDir(m.points[0].point_dir).create().write_progress({"pid": job.pid, "phase": "training"})
        assert point_states(m)[0].state == "running"
        client = mlflow.MlflowClient(m.tracking_uri)
        runs = client.search_runs([client.get_experiment_by_name(m.experiment).experiment_id])
        assert len(runs) == 2, "a KILLED run for each interrupted point, none for the one that runs"
    finally:
        job.kill()
        job.wait()
    state = point_states(m)[0]
    assert (state.state, (state.outcome or {}).get("reason")) == ("failed", Reason.INTERRUPTED)


@pytest.mark.parametrize("command", ["status", "show"])
def test_a_reader_that_leaves_early_gets_no_traceback(
    command: str,
    slurm: RecordedSlurm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 47, case 11: `qualify status | head -1` and `qualify show | head -1`: the reader
    closed the pipe, so the output is cut short; the command ends quietly with the shell's code
    for SIGPIPE, never a BrokenPipeError traceback (stdout here: a pipe whose reader is gone)."""
    make_sweep(tmp_path, ["12_0", "12_1"])
    slurm.answers["sacct"] = sacct(("12_0", "RUNNING", "Unknown"), ("12_1", "RUNNING", "Unknown"))
    slurm.answers["squeue"] = squeue(("12_0", "RUNNING"), ("12_1", "RUNNING"))
    read, write = os.pipe()
    os.close(read)
    pipe = os.fdopen(write, "w")
    monkeypatch.setattr("sys.stdout", pipe)
    argv = ["status", "--runs-dir", str(tmp_path / "runs")] if command == "status" else ["show"]
    assert cli.main(argv) == 141
    assert "Traceback" not in capsys.readouterr().err
    pipe.close()  # its last flush goes nowhere, quietly


def test_a_job_that_died_of_a_full_disk_is_disk_full_with_its_cause(tmp_path: Path) -> None:
    """Issue 47, case 9: a job that could not even write its outcome (the disk is full) died;
    submitit's error holds its log's tail. Before, the detail was its last line ("res = tra")
    and the reason crash; now the reason is disk_full and the detail says what was full. The
    classification of the job's own exceptions: the chain of a CheckpointSaveError."""
    from submitit.core.utils import UncompletedJobError

    from pipeline.job.results import classify
    from pipeline.submit.sweep import _result_or_failure

    _, m = make_sweep(tmp_path, ["12_0"])

    class DeadJob:  # submitit's Job: results() raises as it does for a job that left no result
        def results(self) -> list[Any]:
            raise UncompletedJobError(
                "Job 12_0 (task: 0) with path .../12_0_0_result.pkl\nhas not produced any output (state: FAILED)\n"
                "Error stream produced:\n----------------------------------------\n"
                "OSError: [Errno 28] No space left on device: '/scratch/p0000/outcome.json'\n  res = tra"
            )

    out = _result_or_failure(DeadJob(), m.points[0], m)
    assert (out["outcome"], out["reason"]) == ("failed", Reason.DISK_FULL)
    assert out["detail"].startswith("the partition's storage is full (the job could not write its outcome)")
    quota = OSError(122, "Disk quota exceeded", "/home/u/runs/x")
    assert classify(RuntimeError("saving checkpoint failed"))[1] != Reason.DISK_FULL
    # the words alone, in an exception of the tool's own, are no full disk (issue 46: never words)
    assert classify(KeyError("no space left on device"))[1:] != (Reason.DISK_FULL,)
    assert classify(KeyError("no space left on device"))[1] == Reason.TOOL_ERROR
    # a peer's failed save carries the failed rank's cause as text: that is read
    from pipeline.train.checkpoint import CheckpointSaveError

    peer = CheckpointSaveError(
        "saving checkpoint s failed (on another rank: OSError: [Errno 28] No space left on device)"
    )
    assert classify(peer)[1] == Reason.DISK_FULL
    try:
        raise RuntimeError("saving checkpoint step00000004 failed") from quota
    except RuntimeError as e:
        assert classify(e)[1:] == (
            Reason.DISK_FULL,
            "the user's disk quota is exceeded: RuntimeError: saving checkpoint step00000004 failed",
        )


def test_qualify_status_json_is_the_tables_content(
    slurm: RecordedSlurm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`qualify status --json` over recorded sacct/squeue answers: one object per point and per
    partition, the same counts as the table, null for what is not known (docs/design.md)."""
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1", "12_2"])
    summary = outcome(m.points[0], Outcome.ACCEPTED)
    summary["metrics"] = {K.PERF_TOKENS_PER_S: 1234.5, K.CKPT_VERIFIED: 1.0, "data/tokens_trained": 9.0}
    PointDir(m.points[0].point_dir).write_outcome(summary)
    slurm.answers["sacct"] = sacct(("12_1", "RUNNING", "Unknown"), ("12_2", "PENDING", "Unknown"))
    slurm.answers["squeue"] = squeue(("12_1", "RUNNING"), ("12_2", "PENDING"))
    argv = ["status", "--runs-dir", str(tmp_path / "runs")]
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == 1 and doc["sweep_id"] == SWEEP_ID and doc["launcher"] == "slurm"
    assert doc["not_submitted"] is None
    assert (doc["points_total"], doc["points_ended"], doc["done"]) == (3, 1, False)
    by_id = {p["point_id"]: p for p in doc["points"]}
    assert {k: p["state"] for k, p in by_id.items()} == {
        "p0000": "accepted",
        "p0001": "running",
        "p0002": "pending",
    }
    assert by_id["p0000"]["final"] and not by_id["p0001"]["final"]
    assert by_id["p0001"]["reason"] is None and by_id["p0001"]["metrics"] == {}
    assert [p["job_id"] for p in doc["points"]] == [e.job_id for e in m.points]
    # the partitions: the table's columns, counted from the points themselves
    for part in doc["partitions"]:
        mine = [p for p in doc["points"] if p["partition"] == part["partition"]]
        assert part["points"] == len(mine) == sum(part["counts"].values())
        assert part["finished"] == sum(p["final"] for p in mine)
        assert set(part["counts"]) == {
            "pending",
            "running",
            "requeued",
            "accepted",
            "failed",
            "error",
            "unknown",
        }
    assert sum(p["points"] for p in doc["partitions"]) == 3
    assert sorted(p["partition"] for p in doc["partitions"]) == sorted({e.partition for e in m.points})

    # once every point ended: the failure's reason and detail, the accepted point's metrics
    slurm.answers["sacct"] = sacct(("12_1", "FAILED", ended(60)), ("12_2", "NODE_FAIL", ended(60)))
    slurm.answers["squeue"] = ""
    age_cache(sweep_dir, MIN_QUERY_INTERVAL_S + 1)
    assert cli.main([*argv, "--sweep", SWEEP_ID, "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out)  # nothing but the document on stdout
    assert doc["done"] and doc["points_ended"] == 3 and doc["eta_s"] == 0.0
    failed = {p["point_id"]: p for p in doc["points"]}["p0002"]
    assert (failed["state"], failed["reason"]) == ("failed", Reason.CRASH)
    assert failed["detail"] == "Slurm job 12_2 ended NODE_FAIL without an outcome"
    accepted = {p["point_id"]: p for p in doc["points"]}["p0000"]
    assert accepted["metrics"] == {K.PERF_TOKENS_PER_S: 1234.5, K.CKPT_VERIFIED: 1.0}  # the table's numbers
