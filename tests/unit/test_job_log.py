"""The job's log lines are logging records: `[component] message` on the standard error, the
component the prefix the job's lines always had (`[rank]`, `[job]`, `[drill]`, `[checkpoint]`),
and none of them is lost because it comes before the point's own `logs.setup()`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from pipeline import logs
from pipeline.job import entry


@pytest.fixture(autouse=True)
def _no_handler_left() -> Any:
    yield
    for name in logs.PACKAGES:
        logging.getLogger(name).handlers = []


def test_each_component_keeps_its_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.job.drills import base
    from pipeline.train import checkpoint

    logs.setup()
    base.log.info("preempt at step %d: %s", 3, "scancel --signal=USR2")
    checkpoint.log.warning("rank %d: skipping %s: %s", 1, "step_4", "its manifest is gone")
    entry.log.info("the last point of the sweep: closed the sweep's parent run")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "[drill] preempt at step 3: scancel --signal=USR2",
        "[checkpoint] rank 1: skipping step_4: its manifest is gone",
        "[job] the last point of the sweep: closed the sweep's parent run",
    ]


def test_the_rank_line_before_the_point_starts_is_in_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m pipeline.job.entry SPEC` reads the rank's place (and logs it) before run_point
    sets the log up: main sets it up first."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setenv("SLURMD_NODENAME", "h100-2")
    monkeypatch.setattr(entry, "run_point", lambda spec, renv: {"outcome": "accepted"})
    fields = {"sweep_id": "s", "point_id": "p", "config_yaml": "", "point_dir": str(tmp_path)}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**fields, "parent_run_id": None, "tracking_uri": "", "launcher": "local"}))
    assert entry.main([str(spec)]) == 0
    err = capsys.readouterr().err
    assert "[rank] rank=1/2 local_rank=1 node=h100-2 " in err and "master=127.0.0.1:29999" in err, err
