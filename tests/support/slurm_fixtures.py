"""Fixtures for tests against the local Slurm (cluster/cluster.sh up) and a real MLflow server.

Import the fixtures into a test module (`from slurm_fixtures import mlflow_server, slurm_cluster`).
A missing cluster skips the tests with the reason, except under CI=true, where it fails them:
CI must have started it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_START_S = 90  # a first start migrates the SQLite schema: 10-30 s on 2 cores


def cluster_problem(timeout_s: float = 8) -> str | None:
    """None when the local Slurm answers, else why not."""
    if shutil.which("sinfo") is None:
        return "sinfo is not installed (make cluster-install)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"sinfo did not answer within {timeout_s:.0f} s"
    if out.returncode != 0 or not out.stdout.strip():
        return f"sinfo failed: {out.stderr.strip()[:300]}"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The local Slurm answers; else skip (fail under CI=true)."""
    problem = cluster_problem()
    if problem is None:
        return
    msg = f"local Slurm cluster is not up ({problem}); start it with: make cluster-up"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def server_env() -> dict[str, str]:
    """The environment for a test's own `mlflow server`: as scripts/mlflow_server.sh runs it, without
    MLflow's job runner (eight more processes, about 15 busy core-seconds at each start)."""
    return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


SHARED_SERVER_OPTION = "--one-mlflow-server"


def _server_scope(fixture_name: str, config: pytest.Config) -> str:
    """One server for the whole session with --one-mlflow-server (scripts/test.sh's Slurm
    stream: one test at a time, each on an experiment of its own; a start costs 10-15 s there),
    else one per module: elsewhere modules count the runs of the default experiment."""
    return "session" if config.getoption(SHARED_SERVER_OPTION, default=False) else "module"


@pytest.fixture(scope=_server_scope)
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `mlflow server` (SQLite backend in a temp folder, 127.0.0.1, a free port), for
    many concurrent jobs; yields its URI."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    mlflow = Path(sys.executable).parent / "mlflow"
    cmd = [
        str(mlflow),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--serve-artifacts",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "2",
    ]
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, env=server_env(), start_new_session=True
    )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _healthy(uri):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (root / "server.log").read_text()[-3000:]
                pytest.fail(f"mlflow server did not come up on {uri}:\n{tail}", pytrace=False)
            time.sleep(0.5)
        yield uri
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        log.close()
