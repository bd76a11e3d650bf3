"""Issue 47, case 8, the report's part: a run whose resume skipped checkpoints (the job's
sq.resume_note tag) gets a line in the report's problems, naming the run; a run without the
tag gets none."""

from __future__ import annotations

from analysis.runs import RunRecord, Sweep, check_runs
from pipeline.tracking import keys as K

NOTE = "no valid checkpoint to resume from: all 2 checkpoint(s) failed verification (...); training started again"


def _run(run_id: str, **tags: str) -> RunRecord:
    base = {K.TAG_CANDIDATE: "c", K.TAG_OUTCOME: "accepted", K.TAG_PARTITION: "local"}
    return RunRecord(run_id, run_id, "FINISHED", 1, {**base, **tags}, {}, {"train/steps_done": 4.0})


def test_the_report_names_a_run_whose_resume_skipped_checkpoints() -> None:
    parent = RunRecord("parent", "sweep", "FINISHED", 0, {}, {}, {})
    sweep = Sweep("s", "0", parent, [_run("a", **{K.TAG_RESUME_NOTE: NOTE}), _run("b")])
    said = [p for p in check_runs(sweep) if NOTE in p]
    assert len(said) == 1 and said[0].startswith(sweep.runs[0].label), said
