"""The MLflow store: where it is, whether it answers (a bounded probe), its creation under a
lock, its experiments. Every run is written through a ledger (`pipeline.tracking.ledger`):
the sweep's parent run, each job's run, a point recorded as lost; `analysis/` reads runs
through MLflow's API.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import netrc
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pipeline.home import is_plain_name, project_home
from pipeline.tracking import keys as K


def default_tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else the SQLite store `mlruns.db` in the project home."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_home() / 'mlruns.db'}"


def resolve_uri(uri: str | None) -> str:
    return uri or default_tracking_uri()


# what the login node allows an MLflow server before it goes on without it (stated in the
# README): the probe's wait, then each MLflow request's time-out and retries
PROBE_TIMEOUT_S = 5.0
HTTP_TIMEOUT_S, HTTP_MAX_RETRIES = "10", "2"
# a job's: its ledger keeps every event, so it may wait longer for a server many jobs load at once
JOB_HTTP_TIMEOUT_S = "20"


def missing_store(uri: str) -> str | None:
    """Why a store a reader (report, baseline) would open does not exist yet, or None: opening
    a SQLite URI creates the database, and a reader must create nothing."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():
            return (
                f"there is no MLflow store at {db} (nothing was recorded there yet: run `make sweep` first)"
            )
    return None


def bound_http_requests(timeout_s: str = HTTP_TIMEOUT_S) -> None:
    """Bounded MLflow HTTP calls for this process and the jobs it starts (MLflow's defaults
    retry for about four minutes); a value the user set in the environment is kept."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", timeout_s)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", HTTP_MAX_RETRIES)


def unreachable(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the tracking store cannot be used now (one short phrase), or None when it answers.
    A server is asked for /health once; any HTTP answer (even 401 or 404) means it is there.
    A SQLite store is created or migrated here, once, under a lock (`prepare_sqlite_store`)."""
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
        except urllib.error.HTTPError:
            return None
        except (OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            return f"no answer from {uri} within {timeout_s:.0f} s ({reason})"
        return None
    if uri.startswith("sqlite:///"):
        try:
            prepare_sqlite_store(uri)
        except Exception as e:
            return f"the SQLite store {uri} cannot be opened ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return None


def refused_credentials(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a tracking server that answers refuses this process (HTTP 401 or 403 on a read, with
    the credentials MLflow would send: MLFLOW_TRACKING_USERNAME/PASSWORD, MLFLOW_TRACKING_TOKEN or
    ~/.netrc), or None. A wrong password is no outage: nothing could ever be sent with it."""
    if not uri.startswith(("http://", "https://")):
        return None
    req = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, who = _credentials(uri), "no credentials were sent (none in the environment or ~/.netrc)"
    if isinstance(user, tuple):
        token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
        who = f"the password of user {user[0]!r} was refused"
    elif user:
        req.add_header("Authorization", f"Bearer {user}")
        who = "the token in MLFLOW_TRACKING_TOKEN was refused"
    try:
        urllib.request.urlopen(req, timeout=timeout_s).close()
    except urllib.error.HTTPError as e:
        return f"{uri} answered HTTP {e.code}: {who}" if e.code in (401, 403) else None
    except (OSError, ValueError):
        return None  # an outage is unreachable()'s to report
    return None


def _credentials(uri: str) -> tuple[str, str] | str | None:
    """(user, password) or a token, as MLflow's client would find them."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password is not None:
        return user, password
    if os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return os.environ["MLFLOW_TRACKING_TOKEN"]
    host = urllib.parse.urlsplit(uri).hostname or ""
    with contextlib.suppress(OSError, netrc.NetrcParseError):
        found = netrc.netrc().authenticators(host)
        if found and found[0] and found[2] is not None:
            return found[0], found[2]
    return None


def prepare_sqlite_store(uri: str) -> None:
    """Create or migrate a SQLite store once, under an exclusive lock next to it: two sweeps
    creating the same new store at once otherwise both run MLflow's migrations and one dies
    ("duplicate column name"). After this, every process finds the schema current."""
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            client_for(uri).search_experiments(max_results=1)  # opening the store migrates it
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def client_for(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def artifact_location(uri: str, experiment: str) -> str | None:
    """Artifacts of a SQLite store go next to its file (MLflow's default, ./mlruns, depends on
    the working folder of whoever creates the experiment); a server decides for itself. The
    experiment's folder is one plain name under `mlartifacts/` whatever its name holds (`/`,
    `..`: a name from an imported bundle or a config must not place files outside the store)."""
    if uri.startswith("sqlite:///"):
        folder = experiment if is_plain_name(experiment) else _folder_name(experiment)
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts" / folder).resolve().as_uri()
    return None


def _folder_name(name: str) -> str:
    """A plain folder name for any experiment name: its letters, digits, `.`, `_` and `-`, and a
    hash of the whole name (two names that differ only elsewhere get two folders)."""
    kept = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:80]
    return (
        f"{kept or 'experiment'}-{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:10]}"
    )


def get_or_create_experiment(client: Any, name: str) -> str:
    """The experiment's id, created if needed and marked as holding model-training runs (MLflow
    3's UI then opens it on its runs, not on the GenAI overview)."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get(K.EXP_TAG_KIND) != K.EXP_KIND_TRAINING:
            client.set_experiment_tag(exp.experiment_id, K.EXP_TAG_KIND, K.EXP_KIND_TRAINING)
        return str(exp.experiment_id)
    try:
        return str(
            client.create_experiment(
                name,
                artifact_location=artifact_location(client.tracking_uri, name),
                tags={K.EXP_TAG_KIND: K.EXP_KIND_TRAINING},
            )
        )
    except Exception:  # another process created it between the two calls
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def log_metrics_and_tags(uri: str, run_id: str, metrics: dict[str, float], tags: dict[str, str]) -> None:
    """Log final figures into a run from outside its job (the login node's sacct bill)."""
    from mlflow.entities import Metric, RunTag

    now = int(time.time() * 1000)
    client_for(uri).log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
        tags=[RunTag(k, str(v)) for k, v in tags.items()],
    )
