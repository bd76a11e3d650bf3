"""The tracking server a site runs for many jobs: MLflow on the project's own PostgreSQL, with
MLflow's basic-auth app. Concurrent writers through the project's tracking path lose nothing,
an unauthenticated request is refused, and the password is written nowhere."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support import tracking_server as servers
from tests.support.helpers import NEEDS_POSTGRES, shared_server

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@NEEDS_POSTGRES
def test_postgres_backed_server_with_auth_loses_nothing_and_leaks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with shared_server(tmp_path, monkeypatch.setenv) as server:
        url = server.url
        # the script's server as /proc sees it: the 2 request workers the fixture asked for
        # (WORKERS) and no MLflow job runner or huey consumer (off unless the user turns it on)
        tree = servers.server_processes(url)
        assert sum("multiprocessing.spawn" in c for c in tree) == 2, tree
        assert not [c for c in tree if "mlflow.server.jobs" in c or "huey" in c], tree
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", timeout=30)
        assert refused.value.code == 401
        # what is checked is that nothing is lost and nothing leaks, not the client's timeout: under
        # load a 10 s request timeout (store.py's default) left 2 of 6 writers' events in their
        # ledgers only (for `qualify sync`), which the count below would miss
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
        wall, run_ids = servers.run_writers(url, tmp_path, writers=6, steps=40, experiment="auth")
        assert "None" not in run_ids, run_ids
        assert servers.stored(url, run_ids) == 6 * 40 * len(servers.KEYS)
    found = subprocess.run(["grep", "-rl", server.password, str(tmp_path)], capture_output=True, text=True)
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
