"""`qualify cancel` and `qualify resume` (issue #28 items 1-2) on recorded Slurm answers: the
commands they run, through the one seam (pipeline.slurm.commands.execute), and what they leave
in the sweep folder. The same on the live local Slurm is in test_status_slurm.py; a local sweep
interrupted and resumed for real is at the end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.parent import closed as parent_closed
from pipeline.contract.pointdir import PointDir
from pipeline.slurm import commands
from pipeline.submit.control import cancel_sweep, reopen, resumable
from pipeline.tracking import keys as K
from tests.support.recorded_slurm import RecordedSlurm, make_sweep, outcome, sacct, squeue


class CancellingSlurm(RecordedSlurm):
    """Recorded answers in which an scancel takes effect: the cancelled jobs are CANCELLED in
    sacct and gone from squeue from the next query on."""

    def __init__(self, states: dict[str, str]) -> None:
        super().__init__()
        self.states = dict(states)
        self._answer()

    def _answer(self) -> None:
        self.answers["sacct"] = sacct(
            *(
                (j, s, "Unknown" if s != "CANCELLED" else "2026-01-01T00:00:00")
                for j, s in self.states.items()
            )
        )
        self.answers["squeue"] = squeue(
            *((j, s) for j, s in self.states.items() if s in ("RUNNING", "PENDING"))
        )
        self.answers["scancel"] = ""

    def __call__(self, cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        out = super().__call__(cmd, timeout_s)
        if cmd[0] == "scancel":
            for j in cmd[1:]:
                self.states[j] = "CANCELLED"
            self._answer()
        return out


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> CancellingSlurm:
    # two arrays (12: three tasks, 13: one task); 12_0 already ended accepted
    recorded = CancellingSlurm({"12_0": "COMPLETED", "12_1": "RUNNING", "12_2": "PENDING", "13_0": "RUNNING"})
    monkeypatch.setattr(commands, "execute", recorded)
    return recorded


def test_cancel_sends_one_scancel_per_array_and_ends_the_rest_cancelled(
    tmp_path: Path, cluster: CancellingSlurm
) -> None:
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1", "12_2", "13_0"])
    outcome(m.points[0], Outcome.ACCEPTED)
    res = cancel_sweep(sweep_dir)
    scancels = [c for c in cluster.calls if c[0] == "scancel"]
    assert sorted(scancels) == [["scancel", "12_1", "12_2"], ["scancel", "13_0"]]
    assert res.cancelled_points == [p.point_id for p in m.points[1:]]
    for entry in m.points[1:]:
        got = PointDir(entry.point_dir).read_outcome()
        assert got is not None and (got["outcome"], got["reason"]) == ("failed", Reason.CANCELLED)
    assert PointDir(m.points[0].point_dir).read_outcome()["outcome"] == "accepted"  # type: ignore[index]
    assert res.closed and parent_closed(sweep_dir)["status"] == "KILLED"  # type: ignore[index]

    # idempotent: nothing is left to cancel, nothing is run, nothing changes
    before = len(cluster.calls)
    again = cancel_sweep(sweep_dir)
    assert (again.cancelled_jobs, again.cancelled_points, again.closed) == ([], [], False)
    assert [c[0] for c in cluster.calls[before:]] == ["sacct", "squeue"]


def test_resume_picks_the_points_that_ended_outside_the_candidate_and_only_once(
    tmp_path: Path, cluster: CancellingSlurm, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_dir, m = make_sweep(tmp_path, ["12_0", "12_1", "12_2", "13_0"])
    cluster.states.update({"12_1": "FAILED", "12_2": "COMPLETED", "13_0": "COMPLETED"})
    cluster._answer()
    outcome(m.points[0], Outcome.ACCEPTED)
    outcome(m.points[1], Outcome.FAILED, Reason.OOM)  # the candidate's own result: stays
    outcome(m.points[2], Outcome.FAILED, Reason.CANCELLED)
    outcome(m.points[3], Outcome.ERROR, Reason.TOOL_ERROR)
    chosen = resumable(sweep_dir)
    assert [e.point_id for e in chosen] == [m.points[2].point_id, m.points[3].point_id]
    assert [e.point_id for e in resumable(sweep_dir, [Reason.OOM])] == [m.points[1].point_id]

    reopen(sweep_dir, chosen)
    for entry in chosen:
        assert PointDir(entry.point_dir).read_outcome() is None
    # they were submitted again (new jobs, queued): a second resume finds nothing to run
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    manifest["points"][2]["job_id"], manifest["points"][3]["job_id"] = "20_0", "20_1"
    (sweep_dir / "manifest.json").write_text(json.dumps(manifest))
    cluster.states.update({"20_0": "PENDING", "20_1": "RUNNING"})
    cluster._answer()
    assert resumable(sweep_dir) == []
    assert cli.main(["resume", "--sweep", sweep_dir.name, "--runs-dir", str(sweep_dir.parent)]) == 0
    assert "no point to resume" in capsys.readouterr().out


def test_resume_refuses_a_reason_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["resume", "--only", "cancelled,sunspots", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--only sunspots: not a reason a point ends with" in err and err.count("\n") == 1


def test_cancel_and_resume_of_a_sweep_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cancel", "--sweep", "nope", "--runs-dir", str(tmp_path)]) == 2
    assert cli.main(["resume", "--sweep", "nope", "--runs-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("no sweep 'nope'") == 2
    assert not any(tmp_path.iterdir()), "nothing is written"


@pytest.mark.slow
def test_an_interrupted_local_sweep_resumes_from_its_checkpoints_in_the_same_runs(
    tmp_path: Path, sqlite_uri: str
) -> None:
    """Ctrl-C while the first of two local points trains: both end `interrupted`. `qualify
    resume` runs both again in the same sweep and MLflow runs: the first continues from the
    checkpoint it had (its step count continues), the second starts; both accepted, the parent
    FINISHED with both counted once. A second resume submits nothing."""
    import os
    import signal
    import sys

    from mlflow.tracking import MlflowClient

    from tests.support.helpers import point_runs, qualify, wait_for, with_default_sigint

    runs = tmp_path / "runs"
    args = [f"runs_dir={runs}", f"tracking.uri={sqlite_uri}", "train.seed=1,2", "train.steps=300"]
    proc = subprocess.Popen(
        with_default_sigint([sys.executable, "-m", "pipeline.cli", "sweep", "--sweep", "smoke", "--launcher",
         "local", *args, "train.checkpoint_interval=10", "train.measure_comm=false", "train.measure_ceiling=false"]),
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    # a checkpoint counts once `latest` names it (checkpoint.py's commit point): Ctrl-C reaches
    # the ranks too, and submitit's job controller SIGKILLs them a second later, so a folder
    # renamed into place whose `latest` was not yet moved is not what a resume loads
    first = wait_for(lambda: list(runs.glob("*/points/p0000*/checkpoints/latest")), 300, "a first checkpoint")
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and first, out
    sweep_dir = next(runs.iterdir())
    points = json.loads((sweep_dir / "manifest.json").read_text())["points"]
    assert [json.loads((Path(p["point_dir"]) / "outcome.json").read_text())["reason"] for p in points] == [
        "interrupted"
    ] * 2
    saved = int(
        (Path(points[0]["point_dir"]) / "checkpoints" / "latest").read_text().strip().removeprefix("step")
    )

    res = qualify(["resume", "--sweep", sweep_dir.name, "--runs-dir", str(runs)], timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "resuming 2 point(s)" in res.stdout
    for p in points:
        o = json.loads((Path(p["point_dir"]) / "outcome.json").read_text())
        assert o["outcome"] == "accepted", o
    resumed = json.loads((Path(points[0]["point_dir"]) / "attempts.json").read_text())[-1]
    assert resumed["loaded_step"] == resumed["start_step"] and resumed["start_step"] >= saved > 0, resumed
    runs_ = point_runs(sqlite_uri)
    assert len(runs_) == 2 and all(r.info.status == "FINISHED" for r in runs_), "the same two runs, finished"
    client = MlflowClient(sqlite_uri)
    exp = client.get_experiment_by_name("slurm-qualify")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`sq.kind` = 'sweep'")
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics[f"{K.SWEEP_POINTS_PREFIX}accepted"] == 2.0
    attempts = [(Path(p["point_dir"]) / "attempts.json").read_text() for p in points]
    again = qualify(["resume", "--sweep", sweep_dir.name, "--runs-dir", str(runs)])
    assert again.returncode == 0 and "no point to resume" in again.stdout, again.stdout + again.stderr
    assert [(Path(p["point_dir"]) / "attempts.json").read_text() for p in points] == attempts, (
        "nothing ran again"
    )
