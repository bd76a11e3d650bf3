"""One class is named Attempt: the attempt of a run on one rank (pipeline.job.runner). The
entry's closing of it and the billed allocation (pipeline.measure.cost.BilledAttempt) have
names of their own, so that a reader who finds `Attempt` finds the one thing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLASS_ATTEMPT = re.compile(r"^\s*class Attempt\b", re.MULTILINE)


def test_one_class_is_named_attempt() -> None:
    found = [
        str(p.relative_to(ROOT))
        for package in ("pipeline", "analysis")
        for p in sorted((ROOT / package).rglob("*.py"))
        if CLASS_ATTEMPT.search(p.read_text(encoding="utf-8"))
    ]
    assert found == ["pipeline/job/runner.py"]
