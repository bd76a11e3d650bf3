"""Fixtures shared by the test modules: a real SQLite MLflow store per test."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["slurm_fixtures"]  # slurm_cluster, mlflow_server for every module

os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store whose schema MLflow has made (its migrations take about a
    second per store): each test gets a copy of this file."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("store") / "empty.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments(max_results=1)
    return path


@pytest.fixture
def sqlite_uri(tmp_path: Path, migrated_store: Path) -> str:
    """A fresh MLflow SQLite store of the test's own (mlflow's own tests do the same)."""
    db = tmp_path / "mlruns.db"
    shutil.copyfile(migrated_store, db)
    return f"sqlite:///{db}"
