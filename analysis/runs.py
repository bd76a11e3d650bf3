"""A sweep's runs, read through the MLflow API only (never the store's files).

`load_sweep` finds the sweep's parent run (the newest one when no id is given) and its child
runs with paginated `MlflowClient.search_runs` calls (pages of 10,000: one query per page, no
per-run calls), into plain `RunRecord`s. Nothing here raises on bad data: a run with no
metrics, a partition without a price or a malformed value is kept, and a sentence saying what
is wrong and what it affects goes into `Sweep.problems`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import MISSING, dataclass, field
from typing import Any

from mlflow.tracking import MlflowClient

from pipeline.contract.outcome import Outcome
from pipeline.measure.cost import CostParams, Price
from pipeline.tracking import keys as K

PAGE_SIZE = 10_000
"""Runs per search_runs page: what mlflow.search_runs uses; the SQL stores accept up to 50,000."""
PARENT_TAG = K.TAG_MLFLOW_PARENT
FINISHED_OUTCOMES = (Outcome.ACCEPTED, Outcome.FAILED)
OUTCOMES = (*FINISHED_OUTCOMES, Outcome.ERROR, Outcome.RUNNING, Outcome.SUBMITTED)
"""An `error` run ended in a defect of the tool (or its inputs): it is no result of its candidate,
so it is not finished for the candidate's numbers and cost, and is listed under Problems."""
_NO_VALUE = ("", "none", "null", "nan")


class SweepNotFound(LookupError):
    """No parent run for the sweep (or no sweep at all) in the experiment."""


def parse_float(text: str | None) -> float | None:
    """A param value as a finite float; None when absent, "None"/"null"/"" or not a number."""
    if text is None or text.strip().lower() in _NO_VALUE:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class RunRecord:
    """One MLflow run as plain data. `metrics` holds each key's latest value."""

    run_id: str
    name: str
    status: str
    start_time: int
    tags: Mapping[str, str]
    params: Mapping[str, str]
    metrics: Mapping[str, float]

    def tag(self, key: str, default: str = "") -> str:
        return self.tags.get(key, default)

    def metric(self, key: str) -> float | None:
        """The metric's value, or None when absent or not finite."""
        value = self.metrics.get(key)
        return value if value is not None and math.isfinite(value) else None

    def param_float(self, key: str) -> float | None:
        return parse_float(self.params.get(key))

    @property
    def candidate(self) -> str:
        return self.tag(K.TAG_CANDIDATE) or "/".join(
            self.tag(k, "?") for k in (K.TAG_PARTITION, K.TAG_MODEL, K.TAG_PRECISION, K.TAG_PARALLELISM)
        )

    @property
    def partition(self) -> str:
        return self.tag(K.TAG_PARTITION) or self.params.get("partition.name", "?")

    @property
    def model(self) -> str:
        return self.tag(K.TAG_MODEL) or self.params.get("model.name", "?")

    @property
    def precision(self) -> str:
        return self.tag(K.TAG_PRECISION) or self.params.get("precision.name", "?")

    @property
    def parallelism(self) -> str:
        return self.tag(K.TAG_PARALLELISM) or self.params.get("parallelism.name", "?")

    @property
    def outcome(self) -> str:
        return self.tag(K.TAG_OUTCOME, "unknown")

    @property
    def accepted(self) -> bool:
        return self.outcome == Outcome.ACCEPTED

    @property
    def finished(self) -> bool:
        return self.outcome in FINISHED_OUTCOMES

    @property
    def label(self) -> str:
        """How problems name a run: its name and id."""
        return f"run '{self.name}' ({self.run_id[:8]}, {self.candidate})"

    def price(self) -> Price | None:
        """The partition's dated price the run was configured with; None when it has none."""
        usd = self.param_float("partition.price_usd_per_gpu_hour")
        if usd is None:
            return None
        date = self.tag(K.TAG_PRICE_DATE) or self.params.get("partition.price_date", "")
        source = self.tag(K.TAG_PRICE_SOURCE) or self.params.get("partition.price_source", "")
        return Price(usd, date or "undated", source or "no source given")

    def cost_params(self) -> CostParams | None:
        """The run's cost.* params (what the job costed it with); None if any is missing."""
        values = {}
        for name, f in CostParams.__dataclass_fields__.items():
            value = self.param_float(f"cost.{name}")
            if value is None and f.default is MISSING:
                return None
            if value is None:
                continue  # a later field with a stated default (runs logged before it existed)
            values[name] = value
        return CostParams(**values)

    def gpus(self) -> int | None:
        gpus = parse_float(self.tag(K.TAG_GPUS))
        if gpus is None:
            per_node = self.param_float("parallelism.gpus_per_node")
            nodes = self.param_float("parallelism.nodes") or 1.0
            gpus = per_node * nodes if per_node is not None else None
        return int(gpus) if gpus is not None else None


@dataclass
class Sweep:
    """A sweep's parent run, its child runs and what was wrong with the data."""

    sweep_id: str
    experiment_id: str
    parent: RunRecord
    runs: list[RunRecord]
    problems: list[str] = field(default_factory=list)
    parts: list[Sweep] = field(default_factory=list)
    """The sweeps this one combines (`qualify report --sweeps`, analysis/sweeps.py); [] for one sweep."""

    def by_candidate(self) -> dict[str, list[RunRecord]]:
        groups: dict[str, list[RunRecord]] = {}
        for r in sorted(self.runs, key=lambda r: (r.candidate, r.start_time)):
            groups.setdefault(r.candidate, []).append(r)
        return groups


def to_record(run: Any) -> RunRecord:
    """An mlflow.entities.Run as a RunRecord."""
    info, data = run.info, run.data
    return RunRecord(
        run_id=info.run_id,
        name=info.run_name or info.run_id,
        status=info.status,
        start_time=info.start_time or 0,
        tags=dict(data.tags),
        params=dict(data.params),
        metrics=dict(data.metrics),
    )


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def iter_runs(
    client: MlflowClient,
    experiment_id: str,
    filter_string: str,
    order_by: list[str] | None = None,
    max_runs: int | None = None,
) -> Iterator[Any]:
    """Every run matching the filter, page by page (one query per page)."""
    token: str | None = None
    seen = 0
    while True:
        page_size = PAGE_SIZE if max_runs is None else min(PAGE_SIZE, max_runs - seen)
        page = client.search_runs(
            [experiment_id], filter_string, max_results=page_size, order_by=order_by, page_token=token
        )
        yield from page
        seen += len(page)
        token = page.token
        if not token or (max_runs is not None and seen >= max_runs):
            return


def find_experiment(client: MlflowClient, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        raise SweepNotFound(f"no MLflow experiment named '{name}' at {client.tracking_uri}")
    return str(exp.experiment_id)


def find_parent(client: MlflowClient, experiment_id: str, sweep_id: str | None) -> RunRecord:
    """The sweep's parent run; with no id, the one with the newest start_time."""
    filt = f"tags.`{K.TAG_PARENT_KIND}` = 'sweep'"
    if sweep_id:
        filt += f" and tags.`{K.TAG_SWEEP_ID}` = {_quote(sweep_id)}"
    runs = list(iter_runs(client, experiment_id, filt, order_by=["attributes.start_time DESC"], max_runs=1))
    if not runs:
        what = f"sweep '{sweep_id}'" if sweep_id else "any sweep"
        raise SweepNotFound(
            f"no parent run (tag {K.TAG_PARENT_KIND}=sweep) for {what} in experiment {experiment_id}"
        )
    return to_record(runs[0])


def load_sweep(client: MlflowClient, experiment: str, sweep_id: str | None = None) -> Sweep:
    """A sweep's parent and child runs (children: tag sq.kind=point and the sweep's id)."""
    exp_id = find_experiment(client, experiment)
    parent = find_parent(client, exp_id, sweep_id)
    sid = parent.tag(K.TAG_SWEEP_ID)
    filt = f"tags.`{K.TAG_SWEEP_ID}` = {_quote(sid)} and tags.`{K.TAG_PARENT_KIND}` = 'point'"
    runs = [to_record(r) for r in iter_runs(client, exp_id, filt)]
    sweep = Sweep(sid, exp_id, parent, runs)
    sweep.problems.extend(check_runs(sweep))
    return sweep


def check_runs(sweep: Sweep) -> list[str]:
    """Sentences about data the report cannot use as it is, one per run or partition."""
    problems: list[str] = []
    if not sweep.runs:
        problems.append(
            f"sweep '{sweep.sweep_id}' has a parent run but no child runs (nothing has started yet?)"
        )
    unpriced: dict[str, str] = {}
    running = 0
    for r in sweep.runs:
        if r.tag(PARENT_TAG) and r.tag(PARENT_TAG) != sweep.parent.run_id:
            problems.append(f"{r.label} names parent {r.tag(PARENT_TAG)[:8]}, not the sweep's parent run")
        if r.tag(K.TAG_RESUME_NOTE):
            problems.append(f"{r.label}: {r.tag(K.TAG_RESUME_NOTE)}")
        if not r.tag(K.TAG_CANDIDATE):
            problems.append(f"{r.label} has no {K.TAG_CANDIDATE} tag: grouped by its partition/model tags")
        if r.outcome not in OUTCOMES:
            problems.append(
                f"{r.label} has outcome '{r.outcome}' (expected one of {', '.join(OUTCOMES)}): not counted"
            )
        elif r.outcome == Outcome.ERROR:
            problems.append(
                f"{r.label} ended in a tool error ({r.tag(K.TAG_REASON_DETAIL) or 'no detail'}): a defect of "
                "slurm-qualify or of its inputs, not a result of the partition; not counted in its candidate. "
                "Its traceback is the run's artifact traceback.txt: fix it and run the point again"
            )
        elif not r.finished:
            running += 1
        elif not r.metrics:
            problems.append(
                f"{r.label} is {r.outcome}{' (' + r.tag(K.TAG_REASON) + ')' if r.tag(K.TAG_REASON) else ''} "
                "but logged no metrics: its time, cost and performance are unknown and not counted"
            )
        bad = sorted(k for k, v in r.metrics.items() if not math.isfinite(v))
        if bad:
            problems.append(f"{r.label} has non-finite values for {', '.join(bad)}: ignored")
        raw_price = r.params.get("partition.price_usd_per_gpu_hour")
        if r.price() is None and r.partition not in unpriced:
            unpriced[r.partition] = raw_price if raw_price is not None else "<absent>"
    for part, raw in sorted(unpriced.items()):
        problems.append(
            f"partition '{part}' has no usable price (partition.price_usd_per_gpu_hour = {raw!r}): "
            "its cost columns are not defined and it cannot be recommended"
        )
    if running:
        problems.append(f"{running} run(s) are still running or submitted: the report is provisional")
    return problems


def fetch_histories(
    client: MlflowClient, runs: list[RunRecord], key: str, workers: int = 8
) -> dict[str, list[float]]:
    """One metric's series per run, ordered by step: one get_metric_history call per run, a few
    at a time (MLflow has no public bulk call). Callers sample: thousands of runs is slow."""

    def fetch(run: RunRecord) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(run.run_id, key), key=lambda m: m.step)]

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip([r.run_id for r in runs], pool.map(fetch, runs), strict=True))


def fetch_series(
    client: MlflowClient, runs: list[RunRecord], key: str, workers: int = 8
) -> dict[str, list[tuple[int, float]]]:
    """One metric's (step, value) points per run, ordered by step (one call per run)."""

    def fetch(run: RunRecord) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(run.run_id, key))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip([r.run_id for r in runs], pool.map(fetch, runs), strict=True))


def to_frame(runs: list[RunRecord]) -> Any:
    """The runs as a pandas DataFrame (columns run_id, name, candidate, outcome, tags.*,
    params.*, metrics.*), for notebooks; mlflow already depends on pandas."""
    import pandas as pd

    rows = []
    for r in runs:
        row: dict[str, Any] = {
            "run_id": r.run_id,
            "name": r.name,
            "candidate": r.candidate,
            "outcome": r.outcome,
        }
        row |= {f"tags.{k}": v for k, v in r.tags.items()}
        row |= {f"params.{k}": v for k, v in r.params.items()}
        row |= {f"metrics.{k}": v for k, v in r.metrics.items()}
        rows.append(row)
    return pd.DataFrame(rows)
