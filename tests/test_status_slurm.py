"""Status under requeue on the real local Slurm (cluster/cluster.sh up), through the real CLI:
a preempt-drill point watched with `qualify status` every second until it ends, and a sweep
nobody watches, whose last job closes the parent run. The same logic on recorded Slurm answers
is in test_status_recorded.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from slurm_fixtures import mlflow_server, slurm_cluster  # noqa: F401
from test_slurm_sweep import _manifest, _point_runs, _sweep_id, qualify

from pipeline.tracking import keys as K

FAST = [
    "model=tiny",
    "train.steps=20",
    "train.warmup_steps=2",
    "train.measure_ceiling=false",
    "train.measure_comm=false",
]
WAIT_S = 420


def _parent(uri: str, experiment: str, sweep_id: str):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None and exp.tags.get(K.EXP_TAG_KIND) == K.EXP_KIND_TRAINING, exp
    (run,) = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`{K.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{K.TAG_PARENT_KIND}` = 'sweep'",
    )
    return run


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(WAIT_S + 120)
def test_status_tells_the_truth_under_requeue(
    tmp_path: Path,
    slurm_cluster: None,  # noqa: F811
    mlflow_server: str,  # noqa: F811
) -> None:
    runs = tmp_path / "runs"
    common = [f"runs_dir={runs}", f"tracking.uri={mlflow_server}", *FAST]
    watched = qualify(
        "sweep", "--sweep", "slurm_ci", "partition=a100", "drill=preempt", "drill.preempt.trigger=signal",
        "drill.reference=false", "tracking.experiment=requeue", *common,
    )  # fmt: skip
    unwatched = qualify(
        "sweep", "--sweep", "slurm_ci", "partition=h200", "tracking.experiment=unwatched", *common
    )  # fmt: skip
    assert watched.returncode == 0 and unwatched.returncode == 0, watched.stderr + unwatched.stderr
    sweep_a, sweep_b = _sweep_id(watched.stdout), _sweep_id(unwatched.stdout)
    (point,) = _manifest(runs / sweep_a)["points"]
    outcome_file = Path(point["point_dir"]) / "outcome.json"

    # poll every second until it ends, as a user would
    polls: list[dict[str, int]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < WAIT_S:
        st = qualify("status", "--sweep", sweep_a, "--runs-dir", str(runs))
        assert st.returncode == 0, st.stderr
        has_outcome = outcome_file.exists()  # after the poll: an ended count must be backed by it
        row = re.search(r"^a100\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s", st.stdout, re.M)
        assert row, st.stdout
        counts = dict(
            zip(("pending", "running", "requeued", "accepted", "failed"), map(int, row.groups()), strict=True)
        )
        polls.append(counts)
        assert counts["accepted"] + counts["failed"] <= int(has_outcome), (
            f"counted as ended without an outcome on disk:\n{st.stdout}"
        )
        if counts["accepted"] + counts["failed"] == 1:
            break
        time.sleep(1)
    seen = [next(k for k, v in c.items() if v) for c in polls]
    print(f"{len(polls)} polls: " + " ".join(s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]))
    assert polls[-1]["accepted"] == 1, (
        f"the drill point did not end accepted: {json.loads(outcome_file.read_text())}"
    )
    assert not any(c["failed"] for c in polls), "a point that ends accepted was shown failed"
    attempts = json.loads((Path(point["point_dir"]) / "attempts.json").read_text())
    assert len(attempts) >= 2, attempts  # it was preempted and requeued

    # the parent closed once, after its last child ended, with its summary and description
    children = _point_runs(mlflow_server, "requeue", sweep_a)
    parent = _parent(mlflow_server, "requeue", sweep_a)
    assert parent.info.status == "FINISHED"
    assert parent.info.end_time >= max(c.info.end_time for c in children)
    assert parent.data.metrics[f"{K.SWEEP_POINTS_PREFIX}a100.accepted"] == 1.0
    assert "1 accepted, 0 failed" in parent.data.tags[K.TAG_NOTE]

    # the sweep nobody watched: its last job closed its parent
    deadline = time.monotonic() + WAIT_S
    while not (runs / sweep_b / ".parent_closed").exists() and time.monotonic() < deadline:
        time.sleep(2)
    closer = json.loads((runs / sweep_b / ".parent_closed").read_text())
    assert closer["by"].startswith("job "), closer
    parent_b = _parent(mlflow_server, "unwatched", sweep_b)
    (child_b,) = _point_runs(mlflow_server, "unwatched", sweep_b)
    assert parent_b.info.status == "FINISHED" and child_b.info.status == "FINISHED"
    assert parent_b.info.end_time >= child_b.info.end_time
