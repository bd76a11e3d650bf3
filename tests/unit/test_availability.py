"""Availability in the report (analysis/availability.py): measured queue waits per partition,
the production job's start as the partition answers it, time to result with its band, and the
deadline that puts a candidate apart; figures checked against hand computations on top of the
projection (itself checked by hand in test_analysis_projection.py)."""

from __future__ import annotations

import math

import pytest

from analysis.availability import (
    PartitionQueue,
    StartAnswer,
    availability_section,
    measured_waits,
    partition_queues,
    run_waits,
)
from analysis.projection import parse_target, project_candidate
from analysis.runs import RunRecord
from analysis.table import Row
from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K

H = 3600.0


def _run(run_id: str, partition: str, waits: list[float] | None, tps: float = 3900.0 * 8) -> RunRecord:
    metrics = {
        K.PERF_TOKENS_PER_S: tps,
        K.CKPT_SAVE_S: 3.0,
        K.CKPT_LOAD_S: 0.5,
        K.TIME_STARTUP_S: 10.0,
        K.ATTEMPTS: float(len(waits or [0])),
        K.RESTART_TOTAL_S: 60.0,
    }
    if waits:
        metrics[K.TIME_QUEUE_WAIT_S] = waits[-1]  # the latest attempt's
    tags = {K.TAG_OUTCOME: Outcome.ACCEPTED, K.TAG_GPUS: "8", K.TAG_PARTITION: partition}
    params = {
        "partition.max_time_min": "1200",
        "partition.gpus_per_node": "8",
        "partition.name": partition,
        "partition.slurm_partition": f"slurm-{partition}",
    }
    return RunRecord(run_id, run_id, "FINISHED", 0, tags, params, metrics)


def _rows() -> tuple[list[Row], dict[str, list[float]]]:
    busy = [_run("a1", "a100", [2 * H, 3 * H]), _run("a2", "a100", [4 * H])]
    idle = [_run("h1", "h100", [30.0]), _run("h2", "h100", None)]
    history = {"a1": [(0, 2 * H), (1, 3 * H)]}  # the requeued run's every attempt
    calls: list[list[str]] = []

    def fetch(runs: list[RunRecord]) -> dict[str, list[tuple[int, float]]]:
        calls.append([r.run_id for r in runs])
        return {r.run_id: history[r.run_id] for r in runs}

    waits = run_waits([*busy, *idle], fetch)
    assert calls == [["a1"]], "only the run with several attempts costs a history call"
    rows = [
        Row("a100/tiny", "a100", "tiny", "bf16", "zero2", busy, per_finished_run=1.0),
        Row("h100/tiny", "h100", "tiny", "bf16", "zero2", idle, per_finished_run=2.0),
    ]
    return rows, waits


def test_measured_waits_are_every_attempts_per_partition() -> None:
    _, waits = _rows()
    assert sorted(waits["a100"]) == [2 * H, 3 * H, 4 * H] and waits["h100"] == [30.0]
    assert measured_waits({}, []) == {}


def test_time_to_result_ranks_by_deadline_and_names_the_cheapest_that_meets_it() -> None:
    rows, waits = _rows()
    queues = partition_queues(rows, waits)
    assert queues["a100"].max_time_min == 1200 and queues["a100"].gpus_per_node == 8
    target = parse_target(["project.tokens=1e10", "project.gpus=64", "project.deadline_h=12"])
    assert target is not None
    prices = {"a100/tiny": 1.0, "h100/tiny": 2.0}
    ranked = [
        (row, project_candidate(row.candidate, row.runs, target, prices[row.candidate])) for row in rows
    ]
    asked: list[tuple[str, int, int, int]] = []

    def ask(partition: str, nodes: int, per_node: int, minutes: int) -> StartAnswer:
        asked.append((partition, nodes, per_node, minutes))
        wait = {"slurm-a100": 2.5 * H, "slurm-h100": 0.0}[partition]
        return StartAnswer("2026-12-02T16:00:00", wait_s=wait)

    section, apart = availability_section(rows, ranked, target, queues, ask)
    walls = {row.candidate: p.mid.wall_s for row, p in ranked}
    # the production shape: 64 GPUs on nodes of 8 = 8 nodes, for the projected wall time in minutes
    assert sorted(asked) == [
        ("slurm-a100", 8, 8, math.ceil(walls["a100/tiny"] / 60)),
        ("slurm-h100", 8, 8, math.ceil(walls["h100/tiny"] / 60)),
    ]
    # by hand: the wall time (11.1 h) is under MaxTime (20 h): one job; its wait is the answer
    a100_total = 2.5 * H + walls["a100/tiny"]
    h100_total = 0.0 + walls["h100/tiny"]
    assert a100_total > 12 * H > h100_total, (a100_total / H, h100_total / H)
    assert apart == {"a100/tiny": f"misses the 12 h deadline (time to result {a100_total / H:,.1f} h)"}
    text = str(section.blocks)
    assert "The cheapest candidate that meets the 12 h deadline: h100/tiny" in text
    assert "2026-12-02T16:00:00" in text, "the snapshot's date is in the report"
    queue_table, time_table = section.blocks[1], section.blocks[2]
    a100 = next(r for r in queue_table.rows if r[0] == "a100")
    assert a100[1].startswith("180.0 min (n=3, 120.0-240.0)") and a100[3] == "starts in 2.5 h"
    h100_time = next(r for r in time_table.rows if r[0] == "h100/tiny")
    assert h100_time[1] == f"{h100_total / H:,.1f} h" and "sbatch --test-only" in h100_time[5]


def test_without_an_estimate_the_measured_median_stands_for_the_first_wait() -> None:
    q = PartitionQueue("a100", [60.0, 120.0, 600.0], max_time_min=60)
    model, source = q.model()
    assert model is not None and model.first_wait_s == 120.0 and model.later_wait_s == (60.0, 120.0, 600.0)
    assert model.max_job_s == 3600.0 and "median measured wait" in source


def test_a_partition_with_neither_source_has_no_time_to_result_and_says_why() -> None:
    q = PartitionQueue(
        "local", [], answer=StartAnswer("2026-12-02T16:00:00", refused="the local launcher has no queue")
    )
    model, why = q.model()
    assert model is None and "the local launcher has no queue" in why


@pytest.mark.parametrize("wait", [None, 0.0])
def test_an_idle_partition_without_measured_waits_uses_its_answer_for_every_job(wait: float | None) -> None:
    q = PartitionQueue(
        "h100",
        [],
        answer=StartAnswer("2026-12-02T16:00:00", wait_s=wait, refused="" if wait is not None else "no"),
    )
    model, _ = q.model()
    assert (model is None) == (wait is None)
