"""The sweep's view in the MLflow UI (pipeline/tracking/view.py, `qualify ui-url`): stored on the
experiment as the UI's own shared-view tag, idempotent, and refused for input that makes no URL.
The page itself is checked in Chromium (tests/integration/test_report_browser.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipeline import cli
from pipeline.submit.manifest import Manifest
from pipeline.tracking import keys as K
from pipeline.tracking.view import SHARED_VIEW_PREFIX, publish_runs_view, runs_view, runs_view_url


def test_the_view_filters_the_sweeps_children_and_shows_the_decision_columns() -> None:
    view = runs_view("20261201-120000-abcd")
    assert view["searchFilter"] == (
        "tags.`sq.sweep_id` = '20261201-120000-abcd' and tags.`sq.kind` = 'point'"
    )
    for key in (K.PERF_TOKENS_PER_S, K.PERF_MFU, K.MEM_PEAK_ALLOCATED_GIB, K.RESTART_TOTAL_S,
                K.RESTART_COLD_START_S, K.CAND_USD_PER_FINISHED_RUN, K.CAND_USD_PER_CHECKPOINT):  # fmt: skip
        assert f"metrics.`{key}`" in view["selectedColumns"], key
    assert "tags.`sq.outcome`" in view["selectedColumns"]
    assert view["orderByKey"] == "metrics.`perf/tokens_per_s`" and view["orderByAsc"] is False
    url = runs_view_url("http://127.0.0.1:5000/", "7", "20261201-120000-abcd")
    assert url == (
        "http://127.0.0.1:5000/#/experiments/7/runs?viewStateShareKey=sq-20261201-120000-abcd"
        "&compareRunsMode=TABLE&workflowType=machine_learning"
    )


def test_publish_is_idempotent_and_needs_the_experiment(sqlite_uri: str) -> None:
    client = MlflowClient(tracking_uri=sqlite_uri)
    exp_id = client.create_experiment("slurm-qualify")
    assert publish_runs_view(sqlite_uri, "slurm-qualify", "s1") == exp_id
    tag = SHARED_VIEW_PREFIX + "sq-s1"
    stored = client.get_experiment(exp_id).tags[tag]
    assert json.loads(stored) == runs_view("s1")
    assert publish_runs_view(sqlite_uri, "slurm-qualify", "s1") == exp_id
    assert client.get_experiment(exp_id).tags[tag] == stored
    with pytest.raises(LookupError, match="no experiment 'other'"):
        publish_runs_view(sqlite_uri, "other", "s1")


@pytest.mark.parametrize(
    ("host", "port"), [("127.0.0.1;touch /tmp/x", "5000"), ("127.0.0.1", "5000/../x"), ("a b", "1")]
)
def test_ui_url_refuses_what_makes_no_url(
    tmp_path: Path, host: str, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    (runs / "s1").mkdir(parents=True)
    Manifest("s1", "fake", "2026-12-01T12:00:00", "local", f"sqlite:///{tmp_path}/nowhere.db", "e", []).write(
        runs / "s1"
    )
    assert cli.main(["ui-url", "--runs-dir", str(runs), "--host", host, "--port", port]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_ui_url_without_a_sweep_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ui-url", "--runs-dir", str(tmp_path), "--sweep", "nope"]) == 2
    assert "no sweep 'nope'" in capsys.readouterr().err
