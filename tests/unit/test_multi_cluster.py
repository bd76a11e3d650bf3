"""Multi-cluster Slurm (issue 36, item 4) without a cluster: where `-M <cluster>` goes in each
client command, how a job is recorded with its cluster (`<cluster>:<id>`), and that the Slurm
scheduler asks each job's own cluster, through the one seam where client commands start
(pipeline.slurm.commands.execute), answered per cluster as Slurm would. The real run over two
clusters is tests/integration/test_multi_cluster_sweep.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pipeline.sched import SLURM, SlurmScheduler, job_ref, scheduler_on, split_ref
from pipeline.slurm import commands


class PerCluster:
    """Client commands answered per cluster: `answers[(program, cluster)]` is the stdout of
    `program` addressed with `-M cluster` ("" for none). Every call is kept, with its env."""

    def __init__(self, answers: dict[tuple[str, str], str | None]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []
        self.envs: list[dict[str, str] | None] = []

    def __call__(
        self, cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        self.envs.append(env)
        cluster = cmd[2] if len(cmd) > 2 and cmd[1] == "-M" else ""
        key = (cmd[0], cluster)
        if key not in self.answers:
            raise AssertionError(f"no recording for {cmd}")
        if self.answers[key] is None:  # the client fails, as sinfo -M against a silent controller
            return subprocess.CompletedProcess(cmd, 1, "", f"{cmd[0]}: error: can't be reached now")
        return subprocess.CompletedProcess(cmd, 0, self.answers[key], "")


def test_a_job_is_recorded_with_its_cluster_and_read_back() -> None:
    assert job_ref("sqlocal2", "12") == "sqlocal2:12"
    assert job_ref("sq_b", "12_3") == "sq_b:12_3"  # an array task; a cluster name may hold _
    assert job_ref("", "12") == job_ref(None, "12") == "12"  # the login node's own: as before
    assert split_ref("sq_b:12_3") == ("sq_b", "12_3")
    assert split_ref("12_3") == (None, "12_3")
    assert split_ref("12") == (None, "12")


def test_minus_m_goes_right_after_the_program() -> None:
    at = commands.Address(cluster="b")
    assert commands.addressed(["scontrol", "show", "config"], at) == ["scontrol", "-M", "b", "show", "config"]
    assert commands.addressed(["sbatch", "--parsable", "--wrap=true"], at)[:3] == ["sbatch", "-M", "b"]
    assert commands.addressed(["squeue", "-h"], None) == ["squeue", "-h"]
    assert commands.addressed(["squeue", "-h"], commands.HERE) == ["squeue", "-h"]


def test_every_client_call_of_another_clusters_scheduler_carries_minus_m(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = PerCluster(
        {
            (
                "scontrol",
                "b",
            ): "ClusterName = b\nSlurmctldHost[0] = ctl-b(10.0.0.2)\nSLURM_VERSION = 22.05.8\n"
            "MaxArraySize = 7\n",
            (
                "sbatch",
                "b",
            ): "Job 9 to start at 2026-12-05T01:00:00 using 8 processors on nodes n1 in partition h100",
            ("sinfo", "b"): "h100*\n",
            ("squeue", "b"): "",
        }
    )
    monkeypatch.setattr(commands, "execute", rec)
    other = SLURM.on("b")
    assert other == SlurmScheduler(cluster="b") and SLURM.on("") is SLURM and SLURM.on(None) is SLURM
    assert scheduler_on("slurm", "b") == other and scheduler_on("slurm", "") is SLURM
    assert other.identity().name == "b"
    assert other.max_array_size() == 7
    assert other.start_estimate("h100", 1, 4, 10).partition == "h100"
    assert other.answers()
    assert other.jobs_named("sq-x") == {}
    assert rec.calls and all(c[1:3] == ["-M", "b"] for c in rec.calls), rec.calls


def test_a_slurm_conf_is_handed_to_the_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = PerCluster({("sinfo", ""): "h100*\n"})
    monkeypatch.setattr(commands, "execute", rec)
    assert SlurmScheduler(slurm_conf="/etc/slurm-b/slurm.conf").answers()
    assert rec.envs == [{"SLURM_CONF": "/etc/slurm-b/slurm.conf"}]


def test_states_cancels_and_bills_go_to_each_jobs_own_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both clusters have a job 12: each reference is answered by its own cluster's records."""
    rec = PerCluster(
        {
            ("sacct", "a"): "12|sq-s|COMPLETED|2026-12-05T00:10:00|2026-12-05T00:00:00|2026-12-05T00:01:00\n",
            ("sacct", "b"): "12|sq-s|RUNNING|Unknown|2026-12-05T00:00:00|2026-12-05T00:02:00\n",
            ("squeue", "a"): "",
            ("squeue", "b"): "12|sq-s|RUNNING\n",
            ("scancel", "b"): "",
        }
    )
    monkeypatch.setattr(commands, "execute", rec)
    states = SLURM.job_states(["a:12", "b:12"], job_name="sq-s")
    assert states is not None
    assert states["a:12"].state == "COMPLETED" and not states["a:12"].live
    assert states["b:12"].state == "RUNNING" and states["b:12"].live
    asked = {(c[0], c[2], c[-1]) for c in rec.calls}
    assert asked == {("sacct", "a", "12"), ("squeue", "a", "12"), ("sacct", "b", "12"), ("squeue", "b", "12")}

    rec.calls.clear()
    SLURM.cancel(["b:12"])
    assert rec.calls == [["scancel", "-M", "b", "12"]]

    rec.calls.clear()
    rec.answers[("sacct", "b")] = (
        "12|60|cpu=8,gres/gpu=4|2026-12-05T00:02:00|COMPLETED|2026-12-05T00:00:00|sq-s\n"
    )
    (alloc,) = SLURM.allocations("b:12", "sq-s") or []
    assert alloc.elapsed_s == 60
    assert rec.calls[0][:3] == ["sacct", "-M", "b"] and rec.calls[0][-1] == "12"


def test_a_group_on_another_cluster_is_submitted_with_clusters(tmp_path: Path) -> None:
    import submitit

    from pipeline.config.schema import LauncherConfig
    from pipeline.submit.launcher import ResourceShape, clusters_folder, slurm_executor

    shape = ResourceShape("h100", "gpu:h100:2", 1, 2, 1, None, 10, None, None, None, (), 90)
    ex = slurm_executor(tmp_path, shape, LauncherConfig(), "sq-x", script_only=True, cluster="b")
    text = ex._make_submission_file_text(ex._submitit_command_str, "x")
    assert "#SBATCH --clusters=b" in text
    here = slurm_executor(tmp_path, shape, LauncherConfig(), "sq-x", script_only=True)
    assert "--clusters" not in here._make_submission_file_text(here._submitit_command_str, "x")
    # submitit reads the id of `sbatch -M`'s answer
    assert (
        submitit.SlurmExecutor._get_job_id_from_submission_command("Submitted batch job 12 on cluster b")
        == "12"
    )
    assert clusters_folder(tmp_path, "b") == tmp_path / "clusters" / "b"
    assert clusters_folder(tmp_path, "") == tmp_path


def test_the_report_asks_another_clusters_partition_there() -> None:
    """The report's "when would it start" question goes to each partition's own cluster."""
    from datetime import datetime

    from analysis.availability import PartitionQueue, ask_each
    from pipeline.slurm.cluster import parse_test_only

    asked: list[tuple[object, ...]] = []

    def ask(*args: object) -> object:
        asked.append(args)
        return parse_test_only(None, datetime.now().astimezone())

    queues = {
        "ci_h100": PartitionQueue("ci_h100", gpus_per_node=4, slurm_partition="h100"),
        "b-h100": PartitionQueue("b-h100", gpus_per_node=4, slurm_partition="h100", slurm_cluster="b"),
    }
    ask_each(queues, 8, {"ci_h100": 600.0, "b-h100": 600.0}, ask)
    assert sorted(asked, key=len) == [("h100", 2, 4, 10), ("h100", 2, 4, 10, "b")]


def test_a_cluster_this_login_node_cannot_reach_is_named_before_anything_is_asked_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pipeline.config.schema import ConfigError
    from pipeline.submit.checks import check_clusters_reachable

    rec = PerCluster({("sacctmgr", ""): "a\nb\nc\n", ("sinfo", "b"): "h100*\n", ("sinfo", "c"): None})
    monkeypatch.setattr(commands, "execute", rec)
    check_clusters_reachable([])
    assert not rec.calls  # a sweep on the login node's cluster alone asks nothing more
    check_clusters_reachable(["b"])
    with pytest.raises(ConfigError) as e:
        check_clusters_reachable(["b", "c", "nosuch"])
    text = str(e.value)
    assert "nothing was submitted" in text and "\n" not in text  # one paragraph
    assert "c: its controller does not answer `sinfo -M c`" in text
    assert "nosuch: not a cluster of this login node's slurmdbd (sacctmgr show cluster lists a, b, c)" in text
    assert "b:" not in text
