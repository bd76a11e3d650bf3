"""Tracking loses nothing: with MLflow down every event stays in the ledger and `qualify sync`
replays it; many jobs logging at once through a real `mlflow server` all arrive."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from pipeline.tracking.ledger import Tracker, repair_ledger
from tests.support.helpers import PY, qualify
from tests.support.slurm_fixtures import free_port

WRITER = """
import sys
from pathlib import Path
from pipeline.tracking import store
from pipeline.tracking.ledger import Tracker, repair_ledger
store.bound_http_requests(store.JOB_HTTP_TIMEOUT_S)  # as a job's rank does (pipeline.job.entry)
uri, folder, parent, n = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t = Tracker(uri, "concurrency", folder, run_name=folder.name, parent_run_id=parent, flush_every_s=0.2)
t.log_params({"worker": folder.name})
for step in range(1, n + 1):
    t.log_metrics({"train/loss": 1.0 / step, "perf/step_time_s": 0.01 * step}, step=step)
t.set_tags({"sq.outcome": "accepted"})
t.close()
print("run", t.run_id)
"""


def test_mlflow_down_keeps_the_ledger_and_sync_replays_it(tmp_path: Path, sqlite_uri: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    folder = tmp_path / "point"
    t = Tracker(dead, "slurm-qualify", folder, run_name="p0", flush_every_s=0.1)
    t.log_params({"model.name": "tiny", "train.steps": 30})
    for step in range(1, 31):
        t.log_metrics({"train/loss": 5.0 - step * 0.1}, step=step)
    artifact = tmp_path / "config.yaml"
    artifact.write_text("model: tiny\n")
    t.log_artifact(artifact)
    t.set_tags({"sq.outcome": "accepted"})
    t.close()
    assert t.run_id is None and t.last_error, "MLflow was down: no run could exist"
    lines = (folder / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 34  # params, 30 metrics, artifact, tags, the run's end
    assert json.loads(lines[-1])["k"] == "e" and json.loads(lines[-1])["d"] == "FINISHED"
    assert not (folder / "ledger.synced").exists()

    res = qualify(["sync", str(folder), "--tracking-uri", sqlite_uri])
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"synced 1 ledger\(s\) under .*, 0 still failing", res.stdout), res.stdout
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sqlite_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("slurm-qualify").experiment_id])
    hist = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in hist) == list(range(1, 31))
    assert run.data.params == {"model.name": "tiny", "train.steps": "30"}
    assert run.data.tags["sq.outcome"] == "accepted"
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["config.yaml"]
    assert run.info.status == "FINISHED", "the run's end was replayed from the ledger"
    # a second sync sends nothing twice
    assert qualify(["sync", str(folder), "--tracking-uri", sqlite_uri]).returncode == 0
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) == 30


@pytest.mark.slow
def test_concurrent_jobs_through_a_real_server(tmp_path: Path, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    exp = client.create_experiment("concurrency")
    parent = client.create_run(exp, run_name="sweep").info.run_id  # created once, before the fan-out
    n, workers = 200, 6
    # each writer bounds its MLflow requests as a job does, not as this suite does for its
    # dead-server tests (tests/conftest.py: no retry, 5 s): under CI's load one writer's last
    # request, the run's end, once took longer than that, and stayed in its ledger
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST_")}
    procs = [
        subprocess.Popen(
            [PY, "-c", WRITER, mlflow_server, str(tmp_path / f"w{i}"), parent, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(workers)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    runs = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent}'")
    assert len(runs) == workers
    for r in runs:
        assert len(client.get_metric_history(r.info.run_id, "train/loss")) == n
        assert r.data.tags["sq.outcome"] == "accepted"
    for i in range(workers):
        synced = int((tmp_path / f"w{i}" / "ledger.synced").read_text())
        assert synced == len((tmp_path / f"w{i}" / "ledger.jsonl").read_text().splitlines())


def test_a_torn_ledger_line_is_cut_and_every_attempt_arrives(tmp_path: Path, sqlite_uri: str) -> None:
    """An attempt killed in the middle of appending to the ledger leaves a torn last line. The
    next attempt cuts it and logs into the same run; every complete event of both arrives,
    and the replay reads on from where the cursor is, not from the top."""
    from mlflow.tracking import MlflowClient

    folder = tmp_path / "point"
    first = Tracker(sqlite_uri, "slurm-qualify", folder, run_name="p0", background=False)
    for step in range(1, 6):
        first.log_metrics({"train/loss": 1.0 / step}, step=step)
    first.close(terminate=False)  # the run goes on in the next attempt
    ledger = folder / "ledger.jsonl"
    with open(ledger, "a") as f:
        f.write('{"k": "m", "d": {"train/loss": 0.1')  # the kill lands mid-line

    second = Tracker(sqlite_uri, "slurm-qualify", folder, run_name="p0", background=False)
    assert second.run_id == first.run_id
    for step in range(6, 11):
        second.log_metrics({"train/loss": 1.0 / step}, step=step)
        assert second.flush()
    second.close()
    assert second.ledger_pos == (11, ledger.stat().st_size)  # 10 steps and the end; by byte
    client = MlflowClient(sqlite_uri)
    hist = client.get_metric_history(second.run_id, "train/loss")
    assert sorted(m.step for m in hist) == list(range(1, 11))
    assert client.get_run(second.run_id).info.status == "FINISHED"


@pytest.mark.parametrize(
    ("content", "kept"),
    [
        (b'{"a": 1}\n{"b": 2}\n{"c"', b'{"a": 1}\n{"b": 2}\n'),
        (b'{"a": 1}\n' + b"x" * (3 << 20), b'{"a": 1}\n'),  # a torn line longer than one read-back chunk
        (b'{"a"', b""),
        (b'{"a": 1}\n', b'{"a": 1}\n'),
        (b"", b""),
    ],
)
def test_repair_ledger_keeps_exactly_the_complete_lines(tmp_path: Path, content: bytes, kept: bytes) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_bytes(content)
    repair_ledger(ledger)
    assert ledger.read_bytes() == kept
