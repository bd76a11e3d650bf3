"""The MLflow UI page a reviewer lands on (`make ui`, `qualify ui-url`): a sweep's child runs in
the runs table, one per point, with the columns a decision rests on.

What MLflow 3.17's UI offers for this (read in its JS build, mlflow/server/js/build): the runs
table keeps its state (search filter, sort, selected columns, expanded runs) in the browser's
local storage, not in the URL, except for a *shared view*: the URL parameter
`viewStateShareKey=<key>` makes the page load the JSON state stored in the experiment tag
`mlflow.sharedViewState.<key>` (what its "Share" button writes), search facets and table state
together. A search facet in the URL itself (`searchFilter`, `orderByKey`, ...) would override
the whole shared view, so the URL carries only the key. `compareRunsMode=TABLE` opens the
table (not the charts), and `workflowType=machine_learning` the "Model training" side of the UI
(its own switch; the experiment's `mlflow.experimentKind` tag does not stop 3.17 from opening an
experiment on its GenAI overview): the URL names the runs tab itself.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from pipeline.tracking import keys as K

SHARED_VIEW_PREFIX = K.TAG_MLFLOW_SHARED_VIEW_PREFIX

# the columns, in order: outcome, throughput, efficiency, memory, restart, cost
VIEW_TAGS = (K.TAG_OUTCOME, K.TAG_REASON, K.TAG_CANDIDATE)
VIEW_METRICS = (
    K.PERF_TOKENS_PER_S,
    K.PERF_MFU,
    K.PERF_MFU_VS_CEILING,
    K.MEM_PEAK_ALLOCATED_GIB,
    K.MEM_PEAK_RSS_GIB,
    K.RESTART_TOTAL_S,
    K.RESTART_COLD_START_S,
    K.CAND_USD_PER_FINISHED_RUN,
    K.CAND_USD_PER_CHECKPOINT,
    K.COST_USD,
)


def view_key(sweep_id: str) -> str:
    return f"sq-{sweep_id}"


def runs_view(sweep_id: str) -> dict[str, Any]:
    """The shared view of one sweep: its points' runs (not the parent), fastest first, with
    the decision's columns. Column names are the UI's: metrics.`key`, tags.`key`."""
    columns = [f"tags.`{t}`" for t in VIEW_TAGS] + [f"metrics.`{m}`" for m in VIEW_METRICS]
    return {
        "searchFilter": f"tags.`{K.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{K.TAG_PARENT_KIND}` = 'point'",
        "orderByKey": f"metrics.`{K.PERF_TOKENS_PER_S}`",
        "orderByAsc": False,
        "lifecycleFilter": "Active",
        "selectedColumns": columns,
        "columnOrder": columns,
        "runsHiddenMode": "SHOW_ALL",
    }


def runs_view_url(base: str, experiment_id: str, sweep_id: str) -> str:
    """The runs table of the sweep in the model-training view of the MLflow UI at `base`."""
    key = quote(view_key(sweep_id), safe="")
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={key}&compareRunsMode=TABLE&workflowType=machine_learning"


def publish_runs_view(uri: str, experiment: str, sweep_id: str) -> str:
    """Store the sweep's view on its experiment (idempotent); returns the experiment id."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise LookupError(f"no experiment '{experiment}' in {uri}")
    value = json.dumps(runs_view(sweep_id), separators=(",", ":"))
    tag = SHARED_VIEW_PREFIX + view_key(sweep_id)
    if exp.tags.get(tag) != value:
        client.set_experiment_tag(exp.experiment_id, tag, value)
    return str(exp.experiment_id)
