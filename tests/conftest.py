"""Fixtures shared by the test modules: a real SQLite MLflow store per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["slurm_fixtures"]  # slurm_cluster, mlflow_server for every module

os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture
def sqlite_uri(tmp_path: Path) -> str:
    """A fresh MLflow SQLite store (mlflow's own tests do the same)."""
    return f"sqlite:///{tmp_path / 'mlruns.db'}"
