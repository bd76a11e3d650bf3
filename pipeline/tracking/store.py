"""The MLflow store: where it is, its experiments, and the run calls the login node makes
(the sweep's parent run, a point recorded as lost). One owner of MLflow client calls outside
the ledger's sender (`pipeline.tracking.ledger`); `analysis/` reads runs through MLflow's API.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pipeline.home import project_home


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else the SQLite store `mlruns.db` in the project home."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_home() / 'mlruns.db'}"


def resolve_uri(uri: str | None) -> str:
    return uri or default_tracking_uri()


def client_for(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def artifact_location(uri: str, experiment: str) -> str | None:
    """Artifacts of a SQLite store go next to its file (MLflow's default, ./mlruns, depends on
    the working folder of whoever creates the experiment); a server decides for itself."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts" / experiment).resolve().as_uri()
    return None


def get_or_create_experiment(client: Any, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(
            client.create_experiment(name, artifact_location=artifact_location(client.tracking_uri, name))
        )
    except Exception:  # another process created it between the two calls
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def create_run(
    uri: str, experiment: str, run_name: str, tags: dict[str, str], parent_run_id: str | None = None
) -> str:
    """A new run (a child of `parent_run_id` when given); its id."""
    client = client_for(uri)
    exp_id = get_or_create_experiment(client, experiment)
    if parent_run_id:
        tags = {"mlflow.parentRunId": parent_run_id, **tags}
    return str(client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id)


def log_artifact(uri: str, run_id: str, path: Path) -> None:
    client_for(uri).log_artifact(run_id, str(path))


def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    client_for(uri).set_terminated(run_id, status=status, end_time=int(time.time() * 1000))


def set_tags_and_end(uri: str, run_id: str, tags: dict[str, str], status: str) -> None:
    """Tag a run and end it (a point recorded from outside its job)."""
    client = client_for(uri)
    for key, value in tags.items():
        client.set_tag(run_id, key, value)
    client.set_terminated(run_id, status=status)


def log_metrics_and_tags(uri: str, run_id: str, metrics: dict[str, float], tags: dict[str, str]) -> None:
    """Log final figures into a run from outside its job (the login node's sacct bill)."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    client_for(uri).log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
        tags=[RunTag(k, str(v)) for k, v in tags.items()],
    )
