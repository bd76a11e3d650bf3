"""attempts.json's entries through their one type, `AttemptRecord`: a file written before the
type (or by a newer version) reads and writes back key for key, and what the job writes has
the keys it always had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.contract.accounting import attempt_record
from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import AttemptRecord, StopRecord

# an entry as the job wrote it before the type: a resumed attempt stopped by a preemption, on
# Slurm, with energy, a null loaded_step beside start_step, and a key this version does not know
OLD = {
    "start": 100.0,
    "end": 160.0,
    "allocated_s": 60.0,
    "ranks": 2,
    "start_step": 0,
    "loaded_step": None,
    "fallbacks": 0,
    "productive_s": 40.5,
    "startup_s": 12.0,
    "save_s": 1.5,
    "load_s": 0.0,
    "drills_s": 0.0,
    "saves": 2,
    "saved_bytes": 123456,
    "verified": 1,
    "end_step": 7,
    "gpu_energy_j": 5000.0,
    "gpus_metered": 2,
    "energy_window_s": 50.0,
    "slurm_restarts": 0,
    "stop": "preempt",
    "phase": "train",
    "signal": "SIGUSR2",
    "stop_step": 7,
    "saved_step": 7,
    "drill_fired": True,
    "resubmitted": True,
    "from_a_newer_version": {"x": 1},
}


def test_an_old_entry_reads_and_writes_back_key_for_key(tmp_path: Path) -> None:
    point = PointDir(tmp_path / "p").create()
    point.append_attempt(OLD)
    (rec,) = AttemptRecord.read_all(point.attempts())
    assert (rec.ranks, rec.stop, rec.loaded_step, rec.lost_s) == (2, "preempt", None, None)
    assert rec.extra == {"from_a_newer_version": {"x": 1}}
    assert json.dumps(rec.to_json(), sort_keys=True) == json.dumps(OLD, sort_keys=True)
    facts = rec.facts(3)
    assert (facts.index, facts.stop, facts.saved_step, facts.drill_fired, facts.resubmitted) == (
        3,
        "preempt",
        7,
        True,
        True,
    )


def test_an_attempt_without_a_trainer_writes_its_four_times() -> None:
    rec = attempt_record(process_start=100.0, ranks=2, trainer=None, now=106.5)
    assert rec.to_json() == {"start": 100.0, "end": 106.5, "allocated_s": 6.5, "ranks": 2}


def test_a_stop_adds_only_known_fields() -> None:
    stop = StopRecord(
        "peer_failure", 10.0, 0.0, 5, 4, trigger="rank 1 killed", dead_rank=1, detected_time=12.5
    )
    rec = AttemptRecord(start=0.0, end=1.0, allocated_s=1.0, ranks=2)
    out = AttemptRecord(**{**rec.__dict__, **stop.attempt_facts()}).to_json()
    assert out["stop"] == "peer_failure" and out["failed_after_s"] == pytest.approx(2.5)
    assert set(out) <= {f for f in OLD} | {"failed_after_s"}


def test_entries_that_are_not_objects_are_skipped() -> None:
    assert AttemptRecord.read_all([OLD, "garbage", 3, None]) == [AttemptRecord.from_json(OLD)]
