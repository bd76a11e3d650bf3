"""`sbatch --test-only` answers, read into a dated start estimate (pipeline.slurm.cluster), from
answers recorded on Slurm 22.05 (the local cluster) and the two wordings of Slurm's own
src/sbatch/sbatch.c (the partition is named from 18.08 on); refusals and no answer at all."""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pipeline.slurm import commands
from pipeline.slurm.cluster import parse_test_only

ASKED = datetime(2026, 12, 2, 15, 58, 0)

# recorded here, Slurm 22.05.8: `sbatch --test-only -p h100 -N 2 --gres=gpu:4 -t 60 --wrap=true`
WILL_START_22_05 = (
    "sbatch: Job 1 to start at 2026-12-02T15:58:08 using 2 processors on nodes h100-[1-2] in partition h100"
)
# Slurm 17.11 and older: no partition in the answer
WILL_START_17_11 = "sbatch: Job 3 to start at 2026-12-03T04:00:00 using 64 processors on nodes gpu[01-08]"
# a job_submit plugin's message printed before the answer (print_multi_line_string)
WITH_PLUGIN_MESSAGE = (
    "sbatch: NOTE: jobs on gpu-large are charged per GPU-hour\n"
    "sbatch: Job 77 to start at 2026-12-02T18:30:00 using 512 processors on nodes h100-[001-064] in partition gpu-large"
)
# recorded here, Slurm 22.05.8, refusals (exit code 1)
BAD_PARTITION = (
    "sbatch: error: invalid partition specified: nosuch\nallocation failure: Invalid partition name specified"
)
TOO_MANY_NODES = "allocation failure: Node count specification invalid"
OVER_MAX_TIME = "allocation failure: Requested time limit is invalid (missing or exceeds some limit)"


def test_a_start_is_read_with_its_nodes_partition_and_wait() -> None:
    est = parse_test_only(WILL_START_22_05, ASKED)
    assert est.start == datetime(2026, 12, 2, 15, 58, 8)
    assert (est.nodes, est.partition, est.refused) == ("h100-[1-2]", "h100", "")
    assert est.wait_s == 8.0
    assert est.asked_at == ASKED, "the snapshot keeps the date it was taken"


def test_the_older_wording_without_a_partition() -> None:
    est = parse_test_only(WILL_START_17_11, ASKED)
    assert est.start == datetime(2026, 12, 3, 4, 0, 0) and est.partition == "" and est.nodes == "gpu[01-08]"
    assert est.wait_s == timedelta(hours=12, minutes=2).total_seconds()


def test_a_plugin_message_before_the_answer_is_skipped() -> None:
    est = parse_test_only(WITH_PLUGIN_MESSAGE, ASKED)
    assert est.start == datetime(2026, 12, 2, 18, 30) and est.partition == "gpu-large"


def test_a_start_already_past_waits_zero() -> None:
    est = parse_test_only(WILL_START_22_05, ASKED + timedelta(minutes=5))
    assert est.wait_s == 0.0


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (BAD_PARTITION, "invalid partition specified: nosuch; Invalid partition name specified"),
        (TOO_MANY_NODES, "Node count specification invalid"),
        (OVER_MAX_TIME, "Requested time limit is invalid (missing or exceeds some limit)"),
    ],
)
def test_a_refusal_names_slurms_reason_and_has_no_start(answer: str, why: str) -> None:
    est = parse_test_only(answer, ASKED)
    assert est.start is None and est.wait_s is None
    assert est.refused == why


def test_no_answer_is_said_so() -> None:
    est = parse_test_only(None, ASKED)
    assert est.start is None and "did not answer" in est.refused


def test_an_aware_question_time_reads_slurms_local_time_in_its_zone() -> None:
    asked = datetime(2026, 12, 2, 15, 58, 0).astimezone(timezone.utc)
    est = parse_test_only(WILL_START_22_05, asked)
    assert est.start is not None and est.start.tzinfo is not None
    assert est.wait_s == 8.0


def test_the_command_asks_in_iso_time_and_returns_what_slurm_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def execute(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> Any:
        seen.update(cmd=cmd, env=env)
        return subprocess.CompletedProcess(cmd, 1, "", TOO_MANY_NODES + "\n")

    monkeypatch.setattr(commands, "execute", execute)
    assert commands.test_only(["-p", "h100", "-N", "9"]) == TOO_MANY_NODES
    assert seen["cmd"] == ["sbatch", "--test-only", "-p", "h100", "-N", "9", "--wrap=true"]
    assert seen["env"] == {"SLURM_TIME_FORMAT": "standard"}, (
        "a user's SLURM_TIME_FORMAT=relative would hide the date"
    )


def test_a_command_that_times_out_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    def execute(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> Any:
        raise subprocess.TimeoutExpired(cmd, timeout_s)

    monkeypatch.setattr(commands, "execute", execute)
    assert commands.test_only(["-p", "h100"]) is None


def test_the_slurm_scheduler_asks_for_whole_nodes_of_the_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.sched import LocalScheduler, SlurmScheduler

    seen: list[list[str]] = []

    def execute(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> Any:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", WILL_START_22_05)

    monkeypatch.setattr(commands, "execute", execute)
    est = SlurmScheduler().start_estimate("h100", 2, 4, 90)
    assert seen == [
        [
            "sbatch",
            "--test-only",
            "-p",
            "h100",
            "-N",
            "2",
            "--exclusive",
            "--gres=gpu:4",
            "-t",
            "90",
            "--wrap=true",
        ]
    ]
    assert est.partition == "h100" and est.asked_at.tzinfo is not None, "the question is dated, with its zone"
    local = LocalScheduler().start_estimate("local", 1, 0, 10)
    assert local.start is None and "no queue" in local.refused
