"""Status under requeue on the real local Slurm (cluster/cluster.sh up), through the real CLI:
a preempt-drill point watched with `qualify status` every second until it ends, and a sweep
nobody watches, whose last job closes the parent run. The same logic on recorded Slurm answers
is in test_status_recorded.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from pipeline.contract.outcome import Reason
from pipeline.tracking import keys as K
from tests.support.slurm_fixtures import mlflow_server, slurm_cluster  # noqa: F401
from tests.support.slurm_sweep import ONE_RANK, manifest_of, point_runs, qualify, sweep_id_of

FAST = [
    "model=tiny",
    "train.steps=20",
    "train.warmup_steps=2",
    "train.measure_ceiling=false",
    "train.measure_comm=false",
]
WAIT_S = 900  # a 6-point preempt sweep took 325 s on 2 cores under a load average of 13


def _parent(uri: str, experiment: str, sweep_id: str):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None and exp.tags.get(K.EXP_TAG_KIND) == K.EXP_KIND_TRAINING, exp
    (run,) = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{K.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{K.TAG_PARENT_KIND}` = 'sweep'",
    )
    return run


COLS = ("pending", "running", "requeued", "accepted", "failed", "error")
PREEMPT_AT = 10


def _poll_until_done(sweep_id: str, runs: Path, points: list[dict[str, object]]) -> list[dict[str, int]]:
    """`qualify status` every second until every point ended, as a user would; every poll's
    counts (all partitions). A count of ended points is always backed by outcome files."""
    polls: list[dict[str, int]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < WAIT_S:
        st = qualify("status", "--sweep", sweep_id, "--runs-dir", str(runs))
        assert st.returncode == 0, st.stderr
        on_disk = sum((Path(str(p["point_dir"])) / "outcome.json").exists() for p in points)
        counts = dict.fromkeys(COLS, 0)
        for row in re.finditer(r"^(\S+)\s+" + r"\s+".join([r"(\d+)"] * len(COLS)) + r"\s", st.stdout, re.M):
            for k, v in zip(COLS, row.groups()[1:], strict=True):
                counts[k] += int(v)
        polls.append(counts)
        ended = counts["accepted"] + counts["failed"] + counts["error"]
        assert ended <= on_disk, f"counted as ended without an outcome on disk:\n{st.stdout}"
        done = re.search(r"^all\s+\[[#.]+\] (\d+)/(\d+)", st.stdout, re.M)
        assert done and int(done.group(1)) == ended, st.stdout  # the bar counts final points only
        if ended == len(points):
            return polls
        time.sleep(1)
    raise AssertionError(f"the sweep did not end in {WAIT_S} s: last poll {polls[-1] if polls else None}")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(WAIT_S + 240)
def test_preempted_array_tasks_resume_for_real_and_status_never_calls_them_failed(
    tmp_path: Path,
    slurm_cluster: None,  # noqa: F811
    mlflow_server: str,  # noqa: F811
) -> None:
    """Issue #22: drill=preempt over ZeRO 1, 2, 3 on two partitions (6 points, two job arrays of
    three tasks: the last task Slurm starts keeps the array's id as SLURM_JOB_ID), polled every
    second. Every point is accepted on evidence: its first attempt stopped on the drill's USR2
    and saved at that step, Slurm requeued that task alone (its restart count grew), the next
    attempt loaded that checkpoint and continued; no attempt crashed; no labor is charged; no
    poll showed a point failed; the parent closed after its last child."""
    runs = tmp_path / "runs"
    common = [f"runs_dir={runs}", f"tracking.uri={mlflow_server}", ONE_RANK, *FAST]
    watched = qualify(
        "sweep", "--sweep", "slurm_ci", "partition=ci_a100,ci_h100", "parallelism=zero1,zero2,zero3",
        "drill=preempt", "drill.preempt.trigger=signal", f"drill.preempt.at_step={PREEMPT_AT}",
        "drill.reference=false", "tracking.experiment=requeue", *common,
    )  # fmt: skip
    unwatched = qualify(
        "sweep", "--sweep", "slurm_ci", "partition=ci_h200", "tracking.experiment=unwatched", *common
    )  # fmt: skip
    assert watched.returncode == 0 and unwatched.returncode == 0, watched.stderr + unwatched.stderr
    sweep_a, sweep_b = sweep_id_of(watched.stdout), sweep_id_of(unwatched.stdout)
    points = manifest_of(runs / sweep_a)["points"]
    assert len(points) == 6 and len({p["job_id"].split("_")[0] for p in points}) == 2, points

    polls = _poll_until_done(sweep_a, runs, points)
    print(f"{len(polls)} polls; last {polls[-1]}")
    outcomes = {
        p["point_id"]: json.loads((Path(p["point_dir"]) / "outcome.json").read_text()) for p in points
    }
    assert all(o["outcome"] == "accepted" for o in outcomes.values()), outcomes
    assert not any(c["failed"] or c["error"] for c in polls), "a point that ends accepted was shown failed"
    for p in points:
        attempts = json.loads((Path(p["point_dir"]) / "attempts.json").read_text())
        first, resumed = attempts[0], attempts[1]
        assert first["stop"] == "preempt" and first["signal"] == "SIGUSR2", attempts
        assert first["saved_step"] == first["stop_step"] >= PREEMPT_AT, attempts
        assert resumed["loaded_step"] == resumed["start_step"] == first["saved_step"], attempts
        assert resumed["slurm_restarts"] > first["slurm_restarts"], attempts
        assert not any(a.get("outcome") not in (None, "accepted") for a in attempts), attempts

    children = {c.data.tags[K.TAG_POINT_ID]: c for c in point_runs(mlflow_server, "requeue", sweep_a)}
    assert len(children) == 6
    for pid, run in children.items():
        m = run.data.metrics
        assert m[K.COST_LABOR_USD] == 0.0 and m[K.COST_FAILURES_NEEDING_PERSON] == 0.0, (pid, m)
        assert m[K.RESTART_TOTAL_S] > 0 and m[K.RESTART_LOST_STEPS] == 0.0, (pid, m)
        assert run.data.tags[K.TAG_SLURM_JOB_ID] == next(p["job_id"] for p in points if p["point_id"] == pid)
        assert run.info.status == "FINISHED"

    # the parent closed once, after its last child ended, with its summary and description
    parent = _parent(mlflow_server, "requeue", sweep_a)
    assert parent.info.status == "FINISHED"
    assert parent.info.end_time >= max(c.info.end_time for c in children.values())
    assert parent.data.metrics[f"{K.SWEEP_POINTS_PREFIX}ci_a100.accepted"] == 3.0
    assert "6 accepted, 0 failed" in parent.data.tags[K.TAG_NOTE]

    # the sweep nobody watched: its last job closed its parent
    deadline = time.monotonic() + WAIT_S
    while not (runs / sweep_b / ".parent_closed").exists() and time.monotonic() < deadline:
        time.sleep(2)
    closer = json.loads((runs / sweep_b / ".parent_closed").read_text())
    assert closer["by"].startswith("job "), closer
    parent_b = _parent(mlflow_server, "unwatched", sweep_b)
    (child_b,) = point_runs(mlflow_server, "unwatched", sweep_b)
    assert parent_b.info.status == "FINISHED" and child_b.info.status == "FINISHED"
    assert parent_b.info.end_time >= child_b.info.end_time


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(WAIT_S + 240)
def test_cancel_then_resume_a_sweep_on_slurm(
    tmp_path: Path,
    slurm_cluster: None,  # noqa: F811
    mlflow_server: str,  # noqa: F811
) -> None:
    """Issue #28: 6 points on a100 (4 run at once on its two nodes, the rest queue), cancelled
    once one has a checkpoint: no job of the sweep left in Slurm, every unfinished point
    `cancelled`, the parent closed KILLED with its summary. `qualify resume` runs exactly those
    points to an outcome in the same parent run, from their checkpoints; a second resume submits
    nothing."""
    from mlflow.tracking import MlflowClient

    from pipeline.slurm.cluster import job_states

    runs = tmp_path / "runs"
    # 2 ranks a job (slurm_ci's): 4 jobs fill a100's two nodes and 2 queue (with one rank all 6
    # ran at once, and ended before the cancel)
    common = [f"runs_dir={runs}", f"tracking.uri={mlflow_server}", "tracking.experiment=cancel", *FAST]
    res = qualify(
        "sweep", "--sweep", "slurm_ci", "partition=ci_a100", "train.seed=1,2,3,4,5,6", "train.steps=400",
        "train.checkpoint_interval=10", *common,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    sweep_id = sweep_id_of(res.stdout)
    points = manifest_of(runs / sweep_id)["points"]
    deadline = time.monotonic() + WAIT_S
    while not list((runs / sweep_id).glob("points/*/checkpoints/step*")) and time.monotonic() < deadline:
        time.sleep(1)
    cancel = qualify("cancel", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    ids = [p["job_id"] for p in points]
    assert not [j for j, s in job_states(ids).items() if s.in_slurm], "a job of the sweep is left in Slurm"
    ended = {p["point_id"]: json.loads((Path(p["point_dir"]) / "outcome.json").read_text()) for p in points}
    cancelled = sorted(k for k, o in ended.items() if o["reason"] == Reason.CANCELLED)
    assert cancelled and all(o["outcome"] == "accepted" for k, o in ended.items() if k not in cancelled), (
        ended
    )
    parent = _parent(mlflow_server, "cancel", sweep_id)
    assert parent.info.status == "KILLED"
    assert parent.data.metrics[f"{K.SWEEP_POINTS_PREFIX}failed"] == len(cancelled)
    again = qualify("cancel", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert again.returncode == 0 and "nothing left to cancel" in again.stdout, again.stdout
    # what each cancelled point has committed: a job cancelled mid-save may be killed (KillWait)
    # after its checkpoint's commit and before its attempt record, so the folder is the truth
    newest = {
        p["point_id"]: max(
            (int(c.name.removeprefix("step")) for c in Path(p["point_dir"]).glob("checkpoints/step*")),
            default=None,
        )
        for p in points
    }

    resume = qualify("resume", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert resume.returncode == 0 and f"resuming {len(cancelled)} point(s)" in resume.stdout, resume.stdout
    resubmitted = manifest_of(runs / sweep_id)["points"]
    _poll_until_done(sweep_id, runs, resubmitted)
    for p in resubmitted:
        assert json.loads((Path(p["point_dir"]) / "outcome.json").read_text())["outcome"] == "accepted"
        if p["point_id"] in cancelled:  # resumed from its newest checkpoint, or fresh without one
            resumed = json.loads((Path(p["point_dir"]) / "attempts.json").read_text())[-1]
            assert resumed["loaded_step"] == newest[p["point_id"]], (resumed, newest)
    deadline = time.monotonic() + 60
    while (
        _parent(mlflow_server, "cancel", sweep_id).info.status != "FINISHED" and time.monotonic() < deadline
    ):
        time.sleep(1)
    parent = _parent(mlflow_server, "cancel", sweep_id)
    assert (
        parent.info.status == "FINISHED"
        and parent.info.run_id == manifest_of(runs / sweep_id)["parent_run_id"]
    )
    assert parent.data.metrics[f"{K.SWEEP_POINTS_PREFIX}accepted"] == 6.0
    children = MlflowClient(mlflow_server).search_runs(
        [parent.info.experiment_id], f"tags.`{K.TAG_PARENT_KIND}` = 'point'"
    )
    assert len(children) == 6, "each point counted once, in its own run"
    last = qualify("resume", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert "no point to resume" in last.stdout and manifest_of(runs / sweep_id)["points"] == resubmitted


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(WAIT_S + 240)
def test_a_point_left_preempted_resumes_from_its_checkpoint(
    tmp_path: Path,
    slurm_cluster: None,  # noqa: F811
    mlflow_server: str,  # noqa: F811
) -> None:
    """Issue #28: a preempt-drill point on a partition whose preemptions cancel the job (no
    requeue) ends `preempt_cancelled` after saving at the preempted step; `qualify resume`
    submits it again and it continues from that checkpoint (its step count continues), its
    losses equal to the uninterrupted reference run's: accepted, on evidence."""
    runs = tmp_path / "runs"
    res = qualify(
        "sweep", "--sweep", "slurm_ci", "partition=ci_h200", "drill=preempt", "drill.preempt.trigger=signal",
        f"drill.preempt.at_step={PREEMPT_AT}", "partition.preempt_mode=cancel", "tracking.experiment=left",
        f"runs_dir={runs}", f"tracking.uri={mlflow_server}", ONE_RANK, *FAST,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    sweep_id = sweep_id_of(res.stdout)
    points = manifest_of(runs / sweep_id)["points"]
    _poll_until_done(sweep_id, runs, points)
    point = Path(points[0]["point_dir"])
    left = json.loads((point / "outcome.json").read_text())
    assert (left["outcome"], left["reason"]) == ("failed", Reason.PREEMPT_CANCELLED), left
    (stopped,) = json.loads((point / "attempts.json").read_text())
    assert stopped["stop"] == "preempt" and stopped["saved_step"] == stopped["stop_step"] >= PREEMPT_AT

    resume = qualify("resume", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert resume.returncode == 0 and "resuming 1 point(s)" in resume.stdout, resume.stdout + resume.stderr
    _poll_until_done(sweep_id, runs, manifest_of(runs / sweep_id)["points"])
    done = json.loads((point / "outcome.json").read_text())
    assert done["outcome"] == "accepted", done
    assert "losses equal the uninterrupted reference (tolerance 0.0)" in done["detail"], done
    resumed = json.loads((point / "attempts.json").read_text())[1]
    assert resumed["loaded_step"] == resumed["start_step"] == stopped["saved_step"], resumed
