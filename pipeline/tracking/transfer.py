"""One sweep's runs from one MLflow store into another (`qualify export`, `qualify import`):
for clusters whose login nodes cannot reach one tracking server (docs/clusters.md, "Several
clusters or providers").

`export_sweep` writes a bundle folder: every run of the sweep (its parent, its points, any run
nested under the parent) with its info, tags, params, every value of every metric (the whole
history, with its steps and timestamps) and its artifacts, and the sweep folder's ledgers (the
events each run was logged from). `import_bundle` creates those runs in another store's
experiment, each child under the imported parent, the ledgers attached to their runs as
artifacts (`K.ARTIFACT_LEDGER`): the destination holds everything, and no ledger on its disk
could replay into the wrong store.

Idempotent: every imported run carries the id it had in the store it was first logged to
(`sq.origin_run_id`, kept through later exports) and, once all of it is in, `sq.import_complete`.
An import finds the runs already there by their origin ids and adds nothing for them; a run an
interrupted import left incomplete is deleted and imported again.

Bundle layout (written last: bundle.json, so a half-written bundle is refused):

    bundle.json                  format, sweep id, experiment, source store, run ids (parent first)
    runs/<run id>/run.json       name, status, start and end time, tags, params
    runs/<run id>/metrics.jsonl  one line per logged value: key, value, timestamp, step
    runs/<run id>/artifacts/     the run's artifacts as MLflow stores them
    ledgers/<path>/              each ledger folder of the sweep folder, at its relative path
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.files import write_atomic, write_json
from pipeline.tracking import keys as K
from pipeline.tracking.bundle import (
    ARTIFACTS,
    BUNDLE_FILE,
    BUNDLE_FORMAT,
    LEDGERS,
    METRICS_FILE,
    RUN_FILE,
    RUNS,
    TransferError,
    experiment_problem,
    metric_values,
    read_bundle,
)
from pipeline.tracking.ledger import LedgerDir, unsent_ledgers
from pipeline.tracking.redact import strip_userinfo
from pipeline.tracking.store import client_for, get_or_create_experiment, missing_store, unreachable

_MAX_METRICS, _MAX_PARAMS, _MAX_TAGS = 1000, 100, 100  # MLflow's log_batch limits
_TERMINAL = ("FINISHED", "FAILED", "KILLED")
_PAGE = 10_000
COMPLETE = "1"


@dataclass
class Exported:
    sweep_id: str
    runs: int
    values: int
    """Metric values, all histories together."""
    artifacts: int
    """Artifact files."""
    ledgers: int
    notes: list[str] = field(default_factory=list)


@dataclass
class Imported:
    sweep_id: str
    experiment_id: str
    imported: int
    already: int
    """Runs found complete in the destination (by their origin ids): nothing added."""
    redone: int
    """Runs an interrupted import left incomplete: deleted and imported again."""
    run_ids: dict[str, str] = field(default_factory=dict)
    """Origin run id -> its run in the destination."""


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _search(client: Any, experiment_id: str, filt: str) -> Iterator[Any]:
    token = None
    while True:
        page = client.search_runs([experiment_id], filt, max_results=_PAGE, page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def _open_reader(uri: str, experiment: str) -> tuple[Any, str]:
    where = strip_userinfo(uri)
    if problem := missing_store(uri):
        raise TransferError(f"export: cannot read {where}: {problem}.")
    if problem := unreachable(uri):
        raise TransferError(f"export: cannot read the MLflow store: {problem}.")
    client = client_for(uri)
    try:
        exp = client.get_experiment_by_name(experiment)
    except Exception as e:
        raise TransferError(f"export: cannot read {where}: {type(e).__name__}: {str(e)[:300]}") from e
    if exp is None:
        raise TransferError(f"export: there is no experiment '{experiment}' at {where} (--experiment).")
    return client, str(exp.experiment_id)


def sweep_runs(client: Any, experiment_id: str, sweep_id: str) -> list[Any]:
    """The sweep's parent run first, then every run of the sweep (tag sq.sweep_id) or nested
    under its parent, oldest first. Raises TransferError when the sweep has no parent run."""
    sid = _quote(sweep_id)
    parents = list(
        _search(
            client, experiment_id, f"tags.`{K.TAG_PARENT_KIND}` = 'sweep' and tags.`{K.TAG_SWEEP_ID}` = {sid}"
        )
    )
    if not parents:
        known = sorted(
            {
                r.data.tags.get(K.TAG_SWEEP_ID, "")
                for r in _search(client, experiment_id, f"tags.`{K.TAG_PARENT_KIND}` = 'sweep'")
            }
            - {""}
        )
        listed = ", ".join(known[-10:]) if known else "none"
        raise TransferError(
            f"export: no sweep '{sweep_id}' in experiment {experiment_id} at {strip_userinfo(client.tracking_uri)} "
            f"(no parent run tagged {K.TAG_SWEEP_ID}={sweep_id}); the sweeps there: {listed}."
        )
    parent = parents[0]
    runs = {r.info.run_id: r for r in _search(client, experiment_id, f"tags.`{K.TAG_SWEEP_ID}` = {sid}")}
    nested = f"tags.`{K.TAG_MLFLOW_PARENT}` = {_quote(parent.info.run_id)}"
    runs |= {r.info.run_id: r for r in _search(client, experiment_id, nested)}
    runs.pop(parent.info.run_id, None)
    return [parent, *sorted(runs.values(), key=lambda r: (r.info.start_time or 0, r.info.run_id))]


def export_sweep(uri: str, experiment: str, sweep_id: str, sweep_dir: Path | None, out: Path) -> Exported:
    """Write the bundle of one sweep into `out` (a new or empty folder). `sweep_dir`: the
    sweep's folder, whose ledgers travel along (None or absent: the runs alone, said in a note).
    Raises TransferError before writing anything."""
    client, exp_id = _open_reader(uri, experiment)
    runs = sweep_runs(client, exp_id, sweep_id)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TransferError(
            f"export: {out} exists and is not an empty folder: the bundle is never written over another."
        )
    ledgers = _ledger_folders(sweep_dir, sweep_id) if sweep_dir is not None else []
    result = Exported(sweep_id, len(runs), 0, 0, len(ledgers))
    if sweep_dir is None or not sweep_dir.is_dir():
        result.notes.append(
            f"no sweep folder {sweep_dir} here: the bundle holds the runs without their ledgers (--runs-dir)"
        )
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:
        folder = out / RUNS / run.info.run_id
        folder.mkdir(parents=True)
        write_json(folder / RUN_FILE, _run_info(run))
        result.values += _write_metrics(client, run, folder / METRICS_FILE)
        result.artifacts += _download_artifacts(client, run.info.run_id, folder / ARTIFACTS)
    assert sweep_dir is not None or not ledgers
    ledger_runs = {}
    result_ids = {r.info.run_id for r in runs}
    for ledger in ledgers:
        rel = ledger.relative_to(sweep_dir)  # type: ignore[arg-type]
        shutil.copytree(ledger, out / LEDGERS / rel)
        ledger_runs[str(rel)] = run_id = LedgerDir(ledger).read_run_id()
        if run_id not in result_ids:
            result.notes.append(
                f"the ledger {rel} names no run of the sweep: in the bundle, attached to no run"
            )
    write_json(
        out / BUNDLE_FILE,
        {
            "format": BUNDLE_FORMAT,
            "sweep_id": sweep_id,
            "experiment": experiment,
            "source": strip_userinfo(uri),
            "exported": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "runs": [r.info.run_id for r in runs],
            "ledgers": ledger_runs,
        },
    )
    return result


def _ledger_folders(sweep_dir: Path, sweep_id: str) -> list[Path]:
    """The sweep folder's ledger folders; TransferError when MLflow lacks some of their events
    (exporting then would lose them: `qualify sync` sends them first)."""
    if not sweep_dir.is_dir():
        return []
    unsent = unsent_ledgers(sweep_dir)
    if unsent:
        raise TransferError(
            f"export: {len(unsent)} ledger(s) of sweep {sweep_id} hold events the MLflow store does not have yet "
            f"({', '.join(str(p) for p in unsent[:3])}{', ...' if len(unsent) > 3 else ''}): the bundle would lose "
            f"them. Send them first (qualify sync --sweep {sweep_id}), then export again."
        )
    return sorted(p.parent for p in sweep_dir.rglob(LedgerDir.LEDGER))


def _run_info(run: Any) -> dict[str, Any]:
    info, data = run.info, run.data
    return {
        "run_id": info.run_id,
        "name": info.run_name,
        "status": info.status,
        "start_time": info.start_time,
        "end_time": info.end_time,
        "tags": dict(data.tags),
        "params": dict(data.params),
    }


def _write_metrics(client: Any, run: Any, path: Path) -> int:
    """Every value of every metric of the run (get_metric_history per key), one JSON line each."""
    lines = []
    for key in sorted(run.data.metrics):
        for m in client.get_metric_history(run.info.run_id, key):
            value = m.value if math.isfinite(m.value) else repr(m.value)  # JSON has no NaN
            lines.append(
                json.dumps({"key": m.key, "value": value, "timestamp": m.timestamp, "step": m.step}) + "\n"
            )
    write_atomic(path, "".join(lines))
    return len(lines)


def _download_artifacts(client: Any, run_id: str, dest: Path) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per file otherwise
    entries = client.list_artifacts(run_id)
    if not entries:
        return 0
    dest.mkdir(parents=True)
    for entry in entries:
        client.download_artifacts(run_id, entry.path, str(dest))
    return sum(1 for p in dest.rglob("*") if p.is_file())


# --- import --------------------------------------------------------------------------------


def import_bundle(bundle: Path, uri: str, experiment: str | None = None) -> Imported:
    """Create the bundle's runs in the store at `uri` (experiment: the bundle's unless given),
    skipping those already there (imported before, or the store's own runs: the bundle came
    from it). Raises TransferError before writing anything (the bundle is read and checked
    whole first); a run whose import fails midway is deleted before the error is raised."""
    meta = read_bundle(bundle)
    if experiment is not None and (problem := experiment_problem(experiment)):
        raise TransferError(f"import: --experiment is refused: {problem}. Nothing was imported.")
    if problem := unreachable(uri):
        raise TransferError(f"import: cannot write to the MLflow store: {problem}.")
    client = client_for(uri)
    exp_id = get_or_create_experiment(client, experiment or meta["experiment"])
    present = _imported_runs(client, exp_id)
    ledgers: dict[str, list[Path]] = {}
    for rel, run_id in (meta.get("ledgers") or {}).items():
        if run_id:
            ledgers.setdefault(run_id, []).append(bundle / LEDGERS / rel)
    result = Imported(meta["sweep_id"], exp_id, 0, 0, 0)
    here: dict[str, str] = {}  # the bundle's run id -> its run in the destination (for parents)
    for run_id in meta["runs"]:
        info = meta["infos"][run_id]
        origin = info["tags"].get(K.TAG_ORIGIN_RUN_ID) or run_id
        found = present.get(origin)
        if found is None and (native := _native_run(client, origin)) is not None:
            found = native  # the store's own run: the bundle was exported from here
        if found is not None and (
            found.info.run_id == origin or found.data.tags.get(K.TAG_IMPORT_COMPLETE) == COMPLETE
        ):
            result.already += 1
            result.run_ids[origin] = here[run_id] = found.info.run_id
            continue
        if found is not None:
            client.delete_run(found.info.run_id)
            result.redone += 1
        result.run_ids[origin] = here[run_id] = _import_run(
            client, exp_id, bundle, run_id, info, origin, meta["source"], here, ledgers.get(run_id, [])
        )
        result.imported += 1
    return result


def _native_run(client: Any, run_id: str) -> Any | None:
    """The store's own active run of that id, or None (run ids are unique across stores)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        return None
    return run if run.info.lifecycle_stage == "active" else None


def _imported_runs(client: Any, experiment_id: str) -> dict[str, Any]:
    """The destination's runs that came from elsewhere, by their origin run ids."""
    return {
        r.data.tags[K.TAG_ORIGIN_RUN_ID]: r
        for r in _search(client, experiment_id, f"tags.`{K.TAG_ORIGIN_RUN_ID}` != ''")
    }


def _import_run(
    client: Any,
    exp_id: str,
    bundle: Path,
    bundle_run: str,
    info: dict[str, Any],
    origin: str,
    source: str,
    new_ids: dict[str, str],
    ledgers: list[Path],
) -> str:
    """One run: created with its start time and name, its origin and (remapped) parent tags;
    then its params, tags, metric histories, artifacts and ledgers; then its end; the
    completion tag last. A run that fails midway is deleted (never left half imported)."""
    tags = dict(info["tags"])
    old_parent = tags.pop(K.TAG_MLFLOW_PARENT, None)
    tags.setdefault(K.TAG_ORIGIN_RUN_ID, origin)
    tags.setdefault(K.TAG_ORIGIN_STORE, source)
    first = {K.TAG_ORIGIN_RUN_ID: tags[K.TAG_ORIGIN_RUN_ID]}
    if old_parent:  # the parent came first: its run in the destination
        first[K.TAG_MLFLOW_PARENT] = new_ids.get(old_parent, old_parent)
    run = client.create_run(exp_id, start_time=info["start_time"], tags=first, run_name=info["name"])
    rid = str(run.info.run_id)
    try:
        _fill_run(client, rid, bundle, bundle_run, info, tags, ledgers)
    except BaseException as e:
        client.delete_run(rid)
        if isinstance(e, Exception):
            raise TransferError(
                f"import: run {bundle_run} of {bundle} could not be imported ({type(e).__name__}: "
                f"{str(e)[:300]}); its partial run in the store was deleted. Fix the cause and import again."
            ) from e
        raise
    client.set_tag(rid, K.TAG_IMPORT_COMPLETE, COMPLETE)
    return rid


def _fill_run(
    client: Any,
    rid: str,
    bundle: Path,
    bundle_run: str,
    info: dict[str, Any],
    tags: dict[str, str],
    ledgers: list[Path],
) -> None:
    """The run's params, tags, metric histories, artifacts, ledgers and end."""
    from mlflow.entities import Metric, Param, RunTag

    folder = bundle / RUNS / bundle_run
    params = [Param(k, v) for k, v in info["params"].items()]
    for i in range(0, len(params), _MAX_PARAMS):
        client.log_batch(rid, params=params[i : i + _MAX_PARAMS])
    run_tags = [RunTag(k, v) for k, v in tags.items()]
    for i in range(0, len(run_tags), _MAX_TAGS):
        client.log_batch(rid, tags=run_tags[i : i + _MAX_TAGS])
    metrics: list[Any] = []
    for key, value, timestamp, step in metric_values(bundle, bundle_run):
        metrics.append(Metric(key, value, timestamp, step))
        if len(metrics) == _MAX_METRICS:
            client.log_batch(rid, metrics=metrics)
            metrics = []
    if metrics:
        client.log_batch(rid, metrics=metrics)
    if (folder / ARTIFACTS).is_dir():
        client.log_artifacts(rid, str(folder / ARTIFACTS))
    for ledger in ledgers:  # a run has one ledger folder (its tracking/)
        client.log_artifacts(rid, str(ledger), artifact_path=K.ARTIFACT_LEDGER)
    if info["status"] in _TERMINAL:
        client.set_terminated(rid, status=info["status"], end_time=info["end_time"])
