"""Queue wait per allocation (sacct Eligible -> Start, every allocation of a requeued job and
every task of an array: `sacct -D`), read from answers recorded on the local Slurm 22.05."""

from __future__ import annotations

import pytest

from pipeline.slurm.cluster import Allocation, parse_allocations

# recorded here: `sacct -D -X -n -P -o JobID,ElapsedRaw,AllocTRES,Start,State,Eligible,JobName%200`
# job 3 requeued (scontrol requeue) after 3 s: its second record became eligible again at once
REQUEUED = [
    "3|3|billing=1,cpu=1,node=1|2026-12-02T16:00:25|REQUEUED|2026-12-02T16:00:25|sq-qw-probe",
    "3|4|billing=1,cpu=1,node=1|2026-12-02T16:00:34|COMPLETED|2026-12-02T16:00:34|sq-qw-probe",
]
# recorded here: array 8 (2 tasks, 4 GPUs each) submitted while a blocker job held both a100
# nodes' GPUs for 15 s: each task waited 14 s; then, in the same format, a task still pending
# (sacct's Start "Unknown") and another user's job with the same id range (ignored by name)
BUSY = [
    "8_0|3|billing=1,cpu=1,gres/gpu:a100=4,gres/gpu=4,node=1|2026-12-02T16:01:38|COMPLETED|2026-12-02T16:01:24|sq-abc",
    "8_1|0|billing=1,cpu=1,node=1|Unknown|PENDING|2026-12-02T16:01:24|sq-abc",
    "12|7|billing=1,cpu=1,node=1|2026-12-02T16:13:00|COMPLETED|2026-12-02T16:12:00|someone-else",
]


def test_each_allocation_of_a_requeued_job_has_its_own_wait() -> None:
    allocs = parse_allocations(REQUEUED, "sq-qw-probe")
    assert [a.state for a in allocs] == ["REQUEUED", "COMPLETED"]
    assert [a.queue_wait_s for a in allocs] == [0.0, 0.0]
    assert allocs[1].eligible == "2026-12-02T16:00:34"


def test_a_wait_behind_other_jobs_is_eligible_to_start_and_a_pending_one_has_none() -> None:
    done, pending = parse_allocations(BUSY, "sq-abc")
    assert done.queue_wait_s == pytest.approx(14.0)
    assert pending.start == "Unknown" and pending.queue_wait_s is None
    assert done.gpus == 4


def test_the_older_six_field_answer_still_reads_without_a_wait() -> None:
    (a,) = parse_allocations(
        ["3|4|billing=1,cpu=1,node=1|2026-12-02T16:00:34|COMPLETED|sq-qw-probe"], "sq-qw-probe"
    )
    assert a == Allocation(4.0, None, "2026-12-02T16:00:34", "COMPLETED")
    assert a.queue_wait_s is None, "no Eligible read: absent, never 0"


def test_job_states_carry_the_latest_allocations_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """`sacct -X ... JobID,JobName%200,State,End,Eligible,Start` (recorded format: array 8 above)
    then squeue: the wait survives squeue's live state; a pending task has none."""
    import subprocess

    from pipeline.slurm import commands
    from pipeline.slurm.cluster import read_job_states

    answers = {
        "sacct": "8_0|sq-abc|COMPLETED|2026-12-02T16:01:41|2026-12-02T16:01:24|2026-12-02T16:01:38\n"
        "8_1|sq-abc|PENDING|Unknown|2026-12-02T16:01:24|Unknown\n",
        "squeue": "8_1|sq-abc|PENDING\n",
    }
    monkeypatch.setattr(
        commands, "execute", lambda cmd, t: subprocess.CompletedProcess(cmd, 0, answers[cmd[0]], "")
    )
    states = read_job_states(["8_0", "8_1"], "sq-abc")
    assert states is not None
    assert states["8_0"].queue_wait_s == pytest.approx(14.0)
    assert states["8_1"].queue_wait_s is None and states["8_1"].live


def test_status_states_each_partitions_median_wait_so_far() -> None:
    from pipeline.contract.sweepdir import PointEntry
    from pipeline.submit.status import PointState, PointStatus, queue_wait_lines

    def st(i: int, part: str, wait: float | None) -> PointState:
        entry = PointEntry(f"p{i}", i, [], f"{part}/x", part, "none", f"/tmp/p{i}", "fits", job_id=f"8_{i}")
        return PointState(entry, PointStatus.RUNNING, None, queue_wait_s=wait)

    states = [st(0, "a100", 60.0), st(1, "a100", 180.0), st(2, "a100", None), st(3, "h100", 0.0)]
    assert queue_wait_lines(states) == [
        "queue wait so far (median, sacct Eligible -> Start): a100 2.0 min (n=2), h100 0.0 min (n=1)"
    ]
    assert queue_wait_lines([st(0, "local", None)]) == [], "the local launcher queues nothing: no line"


def test_an_array_task_requeued_has_one_wait_per_allocation() -> None:
    """Rows in the recorded format above (array 8's task 1 and job 3's requeue) put together: an
    array task requeued once after waiting 14 s for its first allocation and 6 s for its second;
    its sibling task ran once. Every allocation keeps its own Eligible and Start (sacct -D)."""
    rows = [
        "8_0|3|billing=1,cpu=1,gres/gpu:a100=4,gres/gpu=4,node=1|2026-12-02T16:01:38|COMPLETED|2026-12-02T16:01:24|sq-abc",
        "8_1|3|billing=1,cpu=1,gres/gpu:a100=4,gres/gpu=4,node=1|2026-12-02T16:01:38|REQUEUED|2026-12-02T16:01:24|sq-abc",
        "8_1|4|billing=1,cpu=1,gres/gpu:a100=4,gres/gpu=4,node=1|2026-12-02T16:01:50|COMPLETED|2026-12-02T16:01:44|sq-abc",
    ]
    task1 = parse_allocations([r for r in rows if r.startswith("8_1|")], "sq-abc")
    assert [(a.state, a.queue_wait_s) for a in task1] == [("REQUEUED", 14.0), ("COMPLETED", 6.0)]
    assert [a.queue_wait_s for a in parse_allocations(rows[:1], "sq-abc")] == [14.0]
