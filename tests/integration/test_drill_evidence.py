"""A drill passes only on evidence that it happened (issue #22, docs/design.md "Drills").

Unit tests of the evidence rules on attempt records written by the job's own writers, of the
job's Slurm identity (the last task Slurm starts from an array keeps the array's id as its
SLURM_JOB_ID), and of the preempt trigger's failure; then real 2-rank runs, started the way
srun starts ranks, for three faults: a trigger that raises, a checkpoint lost between the
attempts (the resume loads nothing), a resume from an older checkpoint. Each ends
drill_failed naming the missing evidence, never accepted and never a crash."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed import DistNetworkError

from pipeline.contract.accounting import needed_person, resume_facts
from pipeline.contract.outcome import Outcome, Reason
from pipeline.drills.preempt import PreemptDrill, trigger_preemption
from pipeline.job.drills import DrillError, StopRecord
from pipeline.job.entry import _stop_facts
from pipeline.job.evidence import AttemptFacts, KillRecord, missing_evidence
from pipeline.job.results import classify
from pipeline.sched import this_job
from pipeline.slurm import commands
from pipeline.tracking import keys as K
from tests.support.helpers import launch_ranks, point_runs, write_spec

# --- the job's own Slurm id ------------------------------------------------------------------

# what Slurm exports to the last task it starts from array 55's own record (task 2): its
# SLURM_JOB_ID is the array's id, which addresses every task of the array
LAST_ARRAY_TASK = {
    "SLURM_JOB_ID": "55",
    "SLURM_ARRAY_JOB_ID": "55",
    "SLURM_ARRAY_TASK_ID": "2",
    "SLURM_JOB_NAME": "sq-sweep",
    "SLURM_JOB_NODELIST": "a100-1",
    "SLURM_RESTART_COUNT": "1",
}
# and to task 0 of the same array, started first under an id of its own
FIRST_ARRAY_TASK = {**LAST_ARRAY_TASK, "SLURM_JOB_ID": "56", "SLURM_ARRAY_TASK_ID": "0"}


def test_an_array_task_is_addressed_by_its_own_id_even_when_slurm_job_id_is_the_arrays() -> None:
    last, first = this_job("slurm", LAST_ARRAY_TASK), this_job("slurm", FIRST_ARRAY_TASK)
    assert last is not None and first is not None
    assert (last.job_id, first.job_id) == ("55_2", "55_0")
    assert (last.name, last.nodelist, last.restart_count) == ("sq-sweep", "a100-1", 1)
    plain = this_job("slurm", {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "x"})
    assert plain is not None and (plain.job_id, plain.restart_count, plain.array_task_id) == ("77", 0, "")


def test_a_local_point_inside_an_salloc_shell_is_no_slurm_job_of_ours() -> None:
    """SLURM_JOB_ID is set in an salloc shell or an sbatch script: the user's own job, which a
    local sweep's drills must never signal, requeue or bill (issue #25 item 1)."""
    assert this_job("local", {"SLURM_JOB_ID": "99", "SLURM_JOB_NODELIST": "n1"}) is None
    assert this_job("slurm", {}) is None


@pytest.fixture
def recorded_commands(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Every Slurm client command the code runs, answered with success (the one seam)."""
    calls: list[list[str]] = []

    def execute(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "4242\n" if cmd[0] == "sbatch" else "a100-1\n", "")

    monkeypatch.setattr(commands, "execute", execute)
    return calls


@pytest.mark.parametrize(
    ("trigger", "expected"),
    [
        ("signal", ["scancel", "--signal=USR2", "--full", "55_2"]),
        ("requeue", ["scontrol", "requeue", "55_2"]),
    ],
)
def test_the_preempt_trigger_addresses_this_task_alone(
    recorded_commands: list[list[str]], trigger: str, expected: list[str]
) -> None:
    trigger_preemption(trigger, this_job("slurm", LAST_ARRAY_TASK))
    assert recorded_commands == [expected]


def test_the_urgent_trigger_names_this_task_and_its_node(recorded_commands: list[list[str]]) -> None:
    done = trigger_preemption("urgent", this_job("slurm", LAST_ARRAY_TASK))
    assert recorded_commands[0] == ["scontrol", "show", "hostnames", "a100-1"]
    sbatch = recorded_commands[1]
    assert "--nodelist=a100-1" in sbatch and "--job-name=sq-urgent-55_2" in sbatch, sbatch
    assert "preempts 55_2" in done


# --- the trigger's own failure ----------------------------------------------------------------


@dataclass
class _Rank:
    rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class _OneRankComm:
    """DistComm's all_ok on a single rank (the collective of one)."""

    calls: list[bool] = field(default_factory=list)

    def all_ok(self, ok: bool) -> bool:
        self.calls.append(ok)
        return ok


@dataclass
class _Trainer:
    comm: _OneRankComm = field(default_factory=_OneRankComm)
    stop: Any = None


def test_a_trigger_that_raises_is_the_drills_failure_not_a_crash() -> None:
    from pipeline.config.schema import DrillConfig

    def broken(trigger: str, job: Any) -> str:
        raise commands.SlurmCommandError("`scancel --signal=USR2 --full 1` failed: Invalid job id specified")

    cfg = DrillConfig()
    cfg.preempt.enabled, cfg.preempt.at_step, cfg.preempt.trigger = True, 4, "signal"
    drill = PreemptDrill(cfg, _Rank(), True, this_job("slurm", LAST_ARRAY_TASK), trigger=broken)  # type: ignore[arg-type]
    trainer = _Trainer()
    drill.after_step(trainer, 3)  # not its step: nothing happens
    assert trainer.comm.calls == []
    with pytest.raises(DrillError) as e:
        drill.after_step(trainer, 4)
    assert trainer.comm.calls == [False], "the ranks agree on the failure in one collective"
    outcome, reason, detail = classify(e.value)
    assert (outcome, reason) == (Outcome.FAILED, Reason.DRILL_FAILED)
    assert "trigger 'signal' failed at step 4" in detail and "Invalid job id" in detail
    assert not needed_person(outcome, reason)


@pytest.mark.parametrize(
    ("exc", "outcome", "reason"),
    [
        (KeyError("qkv_proj"), Outcome.ERROR, Reason.TOOL_ERROR),  # the tool's own defect
        (ValueError("Target modules {'all-linear'} not found"), Outcome.ERROR, Reason.TOOL_ERROR),
        (commands.SlurmCommandError("`sacct` failed"), Outcome.ERROR, Reason.TOOL_ERROR),
        (DistNetworkError("Connection closed by peer [127.0.0.1]:1234"), Outcome.FAILED, Reason.CRASH),
        (
            torch.AcceleratorError("CUDA error: an illegal memory access was encountered"),
            Outcome.FAILED,
            Reason.CRASH,
        ),
        (RuntimeError("CUDA error: words alone, raised by the tool"), Outcome.ERROR, Reason.TOOL_ERROR),
        (
            OSError(28, "No space left on device"),
            Outcome.FAILED,
            Reason.DISK_FULL,
        ),  # issue 47: a named reason
        (FileNotFoundError(2, "No such file", "/data/x.bin"), Outcome.ERROR, Reason.TOOL_ERROR),
        (MemoryError(), Outcome.FAILED, Reason.OOM),
    ],
)
def test_who_failed_follows_the_exception(exc: BaseException, outcome: str, reason: str) -> None:
    got = classify(exc)
    assert got[:2] == (outcome, reason)
    # the type and the first line, for the status table (a full disk first says what was full)
    assert got[2].removeprefix("the partition's storage is full: ").startswith(type(exc).__name__), got
    assert needed_person(*got[:2]) is (reason in (Reason.CRASH, Reason.DISK_FULL))


# --- the evidence rules, on records written by the job's own writers ----------------------------


@dataclass
class _Load:
    step: int
    fallbacks: int = 0


@dataclass
class _Res:
    start_step: int = 0
    load: _Load | None = None


def _stopped(stop: StopRecord, restarts: int | None = 0) -> AttemptFacts:
    """An attempt that stopped, as entry writes its record (start: a fresh run)."""
    rec = {**resume_facts(_Res()), **_stop_facts(stop)}
    if restarts is not None:
        rec["slurm_restarts"] = restarts
    return AttemptFacts.from_record(0, rec)


def _resumed(
    loaded: int | None, restarts: int | None = 1, fallbacks: int = 0, index: int = 1
) -> AttemptFacts:
    res = _Res(loaded or 0, _Load(loaded, fallbacks) if loaded is not None else None)
    rec = resume_facts(res)
    if restarts is not None:
        rec["slurm_restarts"] = restarts
    return AttemptFacts.from_record(index, rec)


PREEMPTED = StopRecord(
    "preempt", 100.0, 103.0, stop_step=11, saved_step=11, trigger="SIGUSR2", drill_fired=True
)


def test_a_preemption_with_its_save_requeue_and_resume_is_evidence() -> None:
    assert missing_evidence("preempt", [_stopped(PREEMPTED), _resumed(11)]) == []
    requeued = StopRecord("terminated", 100.0, 103.0, 11, 11, trigger="SIGTERM", drill_fired=True)
    assert missing_evidence("preempt", [_stopped(requeued), _resumed(11)]) == []
    local = [_stopped(PREEMPTED, restarts=None), _resumed(11, restarts=None)]  # no Slurm: no count
    assert missing_evidence("preempt", local) == []


@pytest.mark.parametrize(
    ("attempts", "named"),
    [
        ([_resumed(None, index=0)], "the run was never interrupted"),
        (
            [_stopped(PREEMPTED), _resumed(None)],
            "attempt 2 loading the checkpoint of step 11: it loaded none",
        ),
        ([_stopped(PREEMPTED), _resumed(5)], "it loaded step 5"),
        ([_stopped(PREEMPTED), _resumed(11, fallbacks=1)], "after skipping 1 newer one(s)"),
        ([_stopped(PREEMPTED), _resumed(11, restarts=0)], "SLURM_RESTART_COUNT stayed 0"),
        (
            [
                _stopped(
                    StopRecord(
                        "preempt", 1.0, 2.0, stop_step=11, saved_step=8, trigger="SIGUSR2", drill_fired=True
                    )
                ),
                _resumed(8),
            ],
            "a save at the step boundary: attempt 1 stopped after step 11, its newest checkpoint was step 8",
        ),
        (
            [
                _stopped(StopRecord("timeout", 1.0, 2.0, stop_step=11, saved_step=11, trigger="SIGUSR2")),
                _resumed(11),
            ],
            "a stop of the run by a preemption signal",
        ),
        (
            [
                _stopped(
                    StopRecord("preempt", 1.0, 2.0, 20, 20, "SIGUSR2", phase="reference", drill_fired=True)
                ),
                _resumed(20),
            ],
            "the run was never interrupted; stops: attempt 1: preempt/reference",
        ),
    ],
)
def test_missing_preempt_evidence_is_named(attempts: list[AttemptFacts], named: str) -> None:
    missing = missing_evidence("preempt", attempts)
    assert any(named in m for m in missing), missing


def _killed(saved: int, detected_after_s: float) -> AttemptFacts:
    stop = StopRecord(
        "peer_failure", 100.0, 0.0, stop_step=12, saved_step=saved, trigger="rank 1 killed", dead_rank=1
    )
    stop.detected_time = 100.0 + detected_after_s
    return _stopped(stop)


def test_kill_worker_evidence() -> None:
    kill = KillRecord(rank=1, after_step=12)
    ok = [_killed(10, 2.0), _resumed(10)]
    assert missing_evidence("kill_worker", ok, kill, kill_rank=1, pg_timeout_s=120) == []
    (m,) = missing_evidence("kill_worker", ok, None, kill_rank=1, pg_timeout_s=120)
    assert m.startswith("the death of rank 1")
    (m,) = missing_evidence("kill_worker", ok, KillRecord(0, 12), kill_rank=1, pg_timeout_s=120)
    assert "rank 0 died instead" in m
    (m,) = missing_evidence("kill_worker", [_killed(10, 300.0), _resumed(10)], kill, 1, 120)
    assert "within the process-group timeout (120 s): they failed 300 s after the kill" in m
    (m,) = missing_evidence("kill_worker", [_killed(0, 2.0), _resumed(None)], kill, 1, 120)
    assert m.startswith("an interval checkpoint before the kill")


# --- real runs, one fault each -----------------------------------------------------------------

BASE = [
    "model=tiny",
    "precision=fp32",
    "parallelism=zero2",
    "train.measure_comm=false",
    "train.measure_ceiling=false",
    "drill=preempt",
    "drill.reference=false",
    "drill.preempt.at_step=5",
    "train.steps=12",
]


def _attempt(
    spec: Path, point: Path, env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    return launch_ranks(spec, timeout=600, env=env)


def _failed(point: Path, uri: str) -> tuple[dict[str, Any], dict[str, str]]:
    outcome = json.loads((point / "outcome.json").read_text())
    (run,) = point_runs(uri)
    return outcome, run.data.tags


@pytest.mark.slow
def test_a_trigger_that_fails_ends_the_point_drill_failed(tmp_path: Path, sqlite_uri: str) -> None:
    """A Slurm point whose trigger cannot signal its job (here: a job id Slurm does not know;
    without Slurm installed, scancel cannot even run): drill_failed, no labor, never a crash."""
    point = tmp_path / "point"
    spec = write_spec(tmp_path, point, [*BASE, "drill.preempt.trigger=signal"], sqlite_uri)
    data = json.loads(spec.read_text())
    spec.write_text(json.dumps({**data, "launcher": "slurm"}))
    results = _attempt(spec, point, env={"SLURM_JOB_ID": "987654321", "SLURM_RESTART_COUNT": "0"})
    outcome, tags = _failed(point, sqlite_uri)
    assert (outcome["outcome"], outcome["reason"]) == ("failed", "drill_failed"), results[0].stdout[-3000:]
    assert "its trigger 'signal' failed at step 5" in outcome["detail"]
    assert tags[K.TAG_REASON] == "drill_failed" and "SlurmCommandError" in tags[K.TAG_REASON_DETAIL]
    assert outcome["metrics"][K.COST_LABOR_USD] == 0.0
    (attempt,) = json.loads((point / "attempts.json").read_text())
    assert attempt["needed_person"] is False
    # the crash report a person acts on: the traceback beside the point and as the run's artifact
    assert "DrillError" in (point / "traceback.txt").read_text()
    from mlflow.tracking import MlflowClient

    (run,) = point_runs(uri := sqlite_uri)
    assert "traceback.txt" in [a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id)]


def _preempted_then(tmp_path: Path, uri: str, fault: Any) -> dict[str, Any]:
    """Attempt 1 is preempted at step 5 (USR2 to the ranks) and saves; `fault(point)` runs
    between the attempts; attempt 2 resumes as the requeue would start it."""
    point = tmp_path / "point"
    spec = write_spec(
        tmp_path,
        point,
        [*BASE, "drill.preempt.trigger=local", "train.checkpoint_interval=2", "train.keep_last=3"],
        uri,
    )
    first = _attempt(spec, point)
    # started by hand, the rank that records the stop exits 3 ("start me again"), the others 0
    assert [r.returncode for r in first] == [3, 0], first[0].stdout[-3000:]
    (stopped,) = json.loads((point / "attempts.json").read_text())
    assert stopped["stop"] == "preempt" and stopped["saved_step"] == stopped["stop_step"] >= 5, stopped
    fault(point, stopped["saved_step"])
    second = _attempt(spec, point)
    outcome = json.loads((point / "outcome.json").read_text())
    assert outcome["outcome"] == "failed", second[0].stdout[-3000:]
    return {"outcome": outcome, "stopped": stopped}


@pytest.mark.slow
def test_a_resume_that_loads_nothing_is_no_preemption_drill(tmp_path: Path, sqlite_uri: str) -> None:
    """The checkpoints are lost between the attempts: the next attempt trains from step 0 and
    its losses equal the uninterrupted run's (training is deterministic), but it resumed
    nothing: drill_failed, not accepted."""
    got = _preempted_then(tmp_path, sqlite_uri, lambda point, step: shutil.rmtree(point / "checkpoints"))
    outcome, saved = got["outcome"], got["stopped"]["saved_step"]
    assert outcome["reason"] == "drill_failed", outcome
    assert (
        f"attempt 2 loading the checkpoint of step {saved}: it loaded none and trained from step 0"
        in (outcome["detail"])
    )


@pytest.mark.slow
def test_a_resume_from_an_older_checkpoint_is_no_preemption_drill(tmp_path: Path, sqlite_uri: str) -> None:
    """The checkpoint saved at the preemption is gone, an older interval checkpoint is not:
    the resume loads that one, and the drill names the step it should have loaded."""

    def drop_newest(point: Path, step: int) -> None:
        shutil.rmtree(point / "checkpoints" / f"step{step:08d}")

    got = _preempted_then(tmp_path, sqlite_uri, drop_newest)
    outcome, saved = got["outcome"], got["stopped"]["saved_step"]
    assert outcome["reason"] == "drill_failed", outcome
    older = (saved - 1) // 2 * 2  # the newest interval checkpoint (every 2 steps) before it
    assert f"attempt 2 loading the checkpoint of step {saved}: it loaded step {older}" in outcome["detail"]


@pytest.mark.slow
def test_a_local_sweep_inside_an_salloc_shell_leaves_the_users_job_alone(
    tmp_path: Path, sqlite_uri: str
) -> None:
    """Issue #25 item 1: with SLURM_JOB_ID set (an salloc shell, an sbatch script), a local
    preempt drill signals its own local tasks and requeues through submitit's local controller;
    it never runs scancel, scontrol requeue or sacct on the user's job (here an id Slurm does
    not know, so any such call would fail the point), and bills from its own clock."""
    from tests.support.helpers import qualify

    runs = tmp_path / "runs"
    res = qualify(
        [
            "sweep", "--sweep", "smoke", "--launcher", "local", "--wait", f"runs_dir={runs}",
            f"tracking.uri={sqlite_uri}", *BASE, "drill.preempt.trigger=local",
        ],
        env={"SLURM_JOB_ID": "987654321", "SLURM_JOB_NODELIST": "nowhere", "SLURM_RESTART_COUNT": "0"},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = point_runs(sqlite_uri)
    assert run.data.tags[K.TAG_OUTCOME] == "accepted", run.data.tags.get(K.TAG_REASON_DETAIL)
    assert K.TAG_SLURM_JOB_ID not in run.data.tags
    assert run.data.tags[K.TAG_ALLOCATED_SOURCE] == K.ALLOCATED_PROCESS_CLOCK
    (point,) = list(runs.glob("*/points/*"))
    first, resumed = json.loads((point / "attempts.json").read_text())
    assert first["stop"] == "preempt" and resumed["loaded_step"] == first["saved_step"]
    assert "slurm_restarts" not in first and "slurm_restarts" not in resumed


class _SignalCame:
    """The stop flag, already set by the signal the trigger asked for."""

    def is_set(self) -> bool:
        return True


def test_a_trigger_that_slurm_answers_late_waits_for_its_signal() -> None:
    """A busy controller answered scancel after the client's time-out, and the signal still
    came (measured here at a load average of 26): the drill waits for it instead of failing;
    whether the preemption happened is then the evidence's to say."""
    from pipeline.config.schema import DrillConfig

    def late(trigger: str, job: Any) -> str:
        raise commands.SlurmTimeout("Slurm did not answer `scancel --signal=USR2 --full 55_2` within 120 s")

    cfg = DrillConfig()
    cfg.preempt.enabled, cfg.preempt.at_step = True, 4
    drill = PreemptDrill(cfg, _Rank(), True, this_job("slurm", LAST_ARRAY_TASK), trigger=late)  # type: ignore[arg-type]
    trainer = _Trainer(stop=_SignalCame())
    drill.after_step(trainer, 4)  # no DrillError
    assert trainer.comm.calls == [True] and drill.done.startswith("signal (Slurm answered late")
