"""The scheduler interface (pipeline/sched): nothing outside it compares launcher strings, and
both schedulers answer as the code that asked Slurm (or did not) before them did.

The Slurm scheduler is checked on recorded client answers at the one seam where commands start
(pipeline.slurm.commands.execute), as tests/unit/test_status_recorded.py does: the command
lines it runs and what it makes of their answers. The local scheduler must never run one.
"""

from __future__ import annotations

import ast
import logging
import subprocess
import textwrap
from pathlib import Path

import pytest

from pipeline.config.schema import LauncherConfig
from pipeline.sched import (
    LOCAL,
    SLURM,
    LauncherKind,
    LocalScheduler,
    SchedulerError,
    SlurmScheduler,
    choose,
    scheduler_for,
    scheduler_of,
    this_job,
)
from pipeline.slurm import commands

REPO = Path(__file__).resolve().parents[2]
KINDS = {k.value for k in LauncherKind}
SCHED = Path("pipeline") / "sched"


def _kind_literals(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and node.value in KINDS:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in KINDS]
    return []


def launcher_comparisons(root: Path) -> list[str]:
    """Every `== "slurm"`, `!= "local"`, `in ("slurm", ...)` of pipeline/ and analysis/ outside
    pipeline/sched/: where a launcher kind is compared instead of a scheduler asked."""
    out = []
    for pkg in ("pipeline", "analysis"):
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root)
            if rel.is_relative_to(SCHED):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare):
                    for side in (node.left, *node.comparators):
                        out += [f"{rel}:{node.lineno}: compares with {v!r}" for v in _kind_literals(side)]
    return out


def test_no_launcher_kind_is_compared_outside_the_scheduler_package() -> None:
    found = launcher_comparisons(REPO)
    assert not found, "ask the scheduler (pipeline.sched.scheduler_for) instead:\n" + "\n".join(found)


def test_the_scan_catches_a_launcher_comparison(tmp_path: Path) -> None:
    files = {
        "pipeline/submit/a.py": "def f(m):\n    return m.launcher == 'slurm'\n",
        "pipeline/submit/b.py": "def g(k):\n    return k in ('local', 'x') or k != \"local\"\n",
        "pipeline/submit/ok.py": "def h(e):\n    e.group = 'local'\n    print('slurm')\n",  # no comparison
        "pipeline/sched/own.py": "def i(k):\n    return k == 'local'\n",  # the package's own
        "analysis/c.py": "def j(k):\n    return 'slurm' == k\n",
    }
    for rel, src in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(src))
    found = launcher_comparisons(tmp_path)
    assert sorted(f.split(":")[0] for f in found) == [
        "analysis/c.py",
        "pipeline/submit/a.py",
        "pipeline/submit/b.py",
        "pipeline/submit/b.py",
    ], found


class Recorded:
    """Slurm's clients answered from recordings (`answers[program]`; `fails[program]` exits 1
    with that stderr); every command line is kept in `calls`."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.fails: dict[str, str] = {}
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        if cmd[0] in self.fails:
            return subprocess.CompletedProcess(cmd, 1, "", self.fails[cmd[0]])
        if cmd[0] not in self.answers:
            raise AssertionError(f"no recording for {cmd}")
        return subprocess.CompletedProcess(cmd, 0, self.answers[cmd[0]], "")


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    recorded = Recorded()
    monkeypatch.setattr(commands, "execute", recorded)
    return recorded


ARRAY_TASK = {"SLURM_JOB_ID": "58", "SLURM_ARRAY_JOB_ID": "55", "SLURM_ARRAY_TASK_ID": "2"}


def test_the_kind_recorded_picks_the_scheduler() -> None:
    assert scheduler_for("slurm") is SLURM and scheduler_for(LauncherKind.LOCAL) is LOCAL
    assert SLURM.kind == "slurm" and LOCAL.kind == "local", "the manifest's strings are unchanged"
    assert SLURM.keeps_jobs and not LOCAL.keeps_jobs
    with pytest.raises(ValueError):
        scheduler_for("auto")  # resolved once, by `choose`, before anything records it


def test_a_second_cluster_is_a_second_slurm_instance() -> None:
    other = SlurmScheduler(slurm_conf="/etc/slurm-b/slurm.conf", cluster="b")
    assert other.kind == SLURM.kind and other != SLURM


def test_choose_asks_slurm_only_for_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[bool] = []
    monkeypatch.setattr(commands, "answers", lambda **_: asked.append(True) or True)
    assert choose(LauncherConfig(kind="local")) == (LauncherKind.LOCAL, "launcher.kind=local")
    assert choose(LauncherConfig(kind="slurm")) == (LauncherKind.SLURM, "launcher.kind=slurm")
    assert not asked
    assert choose(LauncherConfig(kind="auto"))[0] is LauncherKind.SLURM and asked
    monkeypatch.setattr(commands, "answers", lambda **_: False)
    kind, why = choose(LauncherConfig(kind="auto"))
    assert kind is LauncherKind.LOCAL and "no Slurm answers here" in why


def test_this_job_is_the_tasks_own_id_and_none_for_the_local_launcher() -> None:
    job = this_job("slurm", ARRAY_TASK)
    assert job is not None and job.job_id == "55_2", "never the array's id in SLURM_JOB_ID"
    assert scheduler_of(job) is SLURM and scheduler_of(None) is LOCAL
    assert this_job("local", ARRAY_TASK) is None, "an salloc shell's job is the user's, not ours"


def test_cancel_runs_one_scancel_per_array_and_raises_a_refusal(slurm: Recorded) -> None:
    slurm.answers["scancel"] = ""
    SLURM.cancel(["55_2", "56", "55_0", "57_1"])
    assert slurm.calls == [["scancel", "55_0", "55_2"], ["scancel", "56"], ["scancel", "57_1"]]
    slurm.fails["scancel"] = "scancel: error: Invalid job id specified"
    with pytest.raises(SchedulerError, match="Invalid job id"):
        SLURM.cancel(["58_1"])


def test_a_best_effort_cancel_is_one_call_and_ignores_a_refusal(slurm: Recorded) -> None:
    slurm.fails["scancel"] = "scancel: error: Invalid job id specified"
    SLURM.cancel(["55_2", "56", "", "55_2"], best_effort=True)
    assert slurm.calls == [["scancel", "55_2", "56"]]


def test_requeue_self_logs_a_refusal_and_never_raises(
    slurm: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    slurm.fails["scontrol"] = "Requested operation is presently disabled"
    with caplog.at_level(logging.INFO, logger="pipeline.sched.slurm"):
        SLURM.requeue_self(this_job("slurm", ARRAY_TASK), 5.0)
    assert slurm.calls == [["scontrol", "requeue", "55_2"]]
    assert "presently disabled" in caplog.text


def test_preempt_self_names_the_task_and_refuses_what_it_cannot_do(slurm: Recorded) -> None:
    job = this_job("slurm", {**ARRAY_TASK, "SLURM_JOB_NODELIST": "a100-[1-2]"})
    slurm.answers["scancel"] = ""
    assert SLURM.preempt_self("signal", job, 5.0) == "scancel --signal=USR2 --full 55_2"
    slurm.answers["scontrol"] = ""  # `show hostnames` expands to nothing
    with pytest.raises(SchedulerError, match="node list"):
        SLURM.preempt_self("urgent", job, 5.0)
    with pytest.raises(ValueError, match="unknown preempt trigger"):
        SLURM.preempt_self("nonsense", job, 5.0)


def test_the_local_scheduler_runs_no_slurm_client(slurm: Recorded) -> None:
    """Every question has its local answer without a Slurm command (none is recorded: one
    would fail the test)."""
    local = LocalScheduler()
    assert local.job_states(["123"], "sq-x") == {}
    assert local.allocations("123") is None
    local.cancel(["123"])
    local.requeue_self(None, 5.0)
    assert local.this_job(ARRAY_TASK) is None and local.max_array_size() > 10**6
    assert slurm.calls == []
