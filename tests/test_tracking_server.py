"""The tracking server a site runs for many jobs: MLflow on the project's own PostgreSQL, with
MLflow's basic-auth app. Concurrent writers through the project's tracking path lose nothing,
an unauthenticated request is refused, and the password is written nowhere."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "bench_tracking_server", REPO / "benchmarks" / "bench_tracking_server.py"
)
assert _spec and _spec.loader
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

HAVE_POSTGRES = (
    bool(list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))) or shutil.which("initdb") is not None
)


@pytest.mark.slow
@pytest.mark.skipif(
    not HAVE_POSTGRES and os.environ.get("CI") != "true",
    reason="no PostgreSQL server here (bash cluster/postgres.sh install)",
)
def test_postgres_backed_server_with_auth_loses_nothing_and_leaks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path.chmod(0o711)  # the server runs as the postgres user
    password = "s3cret-pw-" + os.urandom(6).hex()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "sqadmin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    with bench.postgres(tmp_path) as env, bench.mlflow_server(tmp_path, "postgres", env, auth=True) as url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", timeout=30)
        assert refused.value.code == 401
        wall, run_ids = bench.run_writers(url, tmp_path, writers=6, steps=40, experiment="auth")
        assert bench.stored(url, run_ids) == 6 * 40 * len(bench.KEYS)
    found = subprocess.run(["grep", "-rl", password, str(tmp_path)], capture_output=True, text=True)
    assert found.stdout == "", f"the password was written to: {found.stdout}"


def test_an_exposed_server_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env.update(
        VENV=str(Path(sys.executable).parent.parent),
        HOST="0.0.0.0",
        PORT="1",
        SQ_MLFLOW_STATE=str(tmp_path / "s"),
        ARTIFACTS=str(tmp_path / "a"),
    )
    res = subprocess.run(
        ["bash", "scripts/mlflow_server.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2
    assert "MLFLOW_TRACKING_USERNAME" in res.stderr and "Not started" in res.stderr


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.skipif(
    not HAVE_POSTGRES and os.environ.get("CI") != "true",
    reason="no PostgreSQL server here (bash cluster/postgres.sh install)",
)
def test_a_slurm_sweep_logs_every_metric_to_the_shared_server(
    tmp_path: Path, slurm_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six points on the local Slurm log to the PostgreSQL-backed server with basic auth (the
    jobs read the credentials from the environment sbatch hands them): every metric event of
    every point's ledger is in MLflow, and the password is in no job log, file, param or tag."""
    from helpers import point_runs, qualify
    from mlflow.tracking import MlflowClient

    tmp_path.chmod(0o711)  # the server runs as the postgres user
    password = "s3cret-pw-" + os.urandom(6).hex()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "sqadmin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    with bench.postgres(tmp_path) as env, bench.mlflow_server(tmp_path, "postgres", env, auth=True) as url:
        args = ["sweep", "--sweep", "slurm_ci", "--launcher", "slurm", "--wait", "train.seed=1,2"]
        args += ["train.steps=10", "train.measure_comm=false", f"runs_dir={tmp_path / 'runs'}"]
        res = qualify([*args, f"tracking.uri={url}"], timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        runs = point_runs(url)
        assert len(runs) == 6
        assert {r.data.tags["sq.outcome"] for r in runs} == {"accepted"}, [
            r.data.tags.get("sq.reason") for r in runs
        ]
        client = MlflowClient(tracking_uri=url)
        by_point = {r.data.tags["sq.point_id"]: r for r in runs}
        for ledger in (tmp_path / "runs").glob("*/points/*/tracking/ledger.jsonl"):
            run = by_point[ledger.parent.parent.name]
            events = [json.loads(line) for line in ledger.read_text().splitlines()]
            logged: dict[str, set[tuple[int | None, float]]] = {}
            for ev in events:
                if ev["k"] == "m":
                    for key, value in ev["d"].items():
                        logged.setdefault(key, set()).add((ev["s"], value))
            assert len(logged) > 20, sorted(logged)  # the point's measurements, not a handful
            for key, points in logged.items():
                stored = {(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)}
                assert {(s or 0, v) for s, v in points} <= stored, key
            texts = [*run.data.params.values(), *run.data.tags.values()]
            assert not [t for t in texts if password in t]
    found = subprocess.run(["grep", "-rl", password, str(tmp_path)], capture_output=True, text=True)
    assert found.stdout == "", f"the password was written to: {found.stdout}"
