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
