"""Issue 36, item 4: ONE sweep that spans two Slurm clusters of one slurmdbd. `cluster/cluster.sh
up` starts sqlocal and sqlocal2 on one accounting database. From sqlocal's login node (this
machine's default slurm.conf), a sweep over `partition=ci_h100,sqlocal2/ci_h100` with two seeds
submits a job array of two tasks to each cluster (`--clusters`), records each job with its
cluster, follows both with `qualify status`, bills each from its own cluster's sacct, and each
run names the cluster Slurm's own accounting says it ran on. A held sweep over both is then
cancelled with `qualify cancel`, which reaches the second cluster's job, and `qualify resume`
submits each point again to its own cluster. A partition naming a cluster this login node
cannot reach is refused (exit 2) before anything is submitted. (A job requeueing itself on the
second cluster: test_drills.py's preempt-requeue drill.)
Run: .venv/bin/python -m pytest tests/integration/test_multi_cluster_sweep.py
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pipeline.tracking import keys as K
from tests.support.slurm_fixtures import slurm_cluster  # noqa: F401
from tests.support.slurm_sweep import ONE_RANK, TINY, follow, manifest_of, point_runs, qualify, sweep_id_of

BOTH = "partition=ci_h100,sqlocal2/ci_h100"  # sqlocal's h100, and sqlocal2's (conf/partition/sqlocal2/)
FAST = [*TINY, "train.measure_comm=false", "train.measure_ceiling=false", ONE_RANK]


def sacct_row(cluster: str, job_id: str) -> list[str]:
    """Cluster, Partition, State of one job, as the accounting database says (sacct -M)."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-M", cluster, "-j", job_id, "-o", "Cluster,Partition,State"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    assert len(rows) == 1, out
    return rows[0]


@pytest.mark.slurm
@pytest.mark.timeout(400)
def test_one_sweep_spans_two_clusters_of_one_slurmdbd(tmp_path: Path, slurm_cluster: None) -> None:  # noqa: F811
    runs = tmp_path / "runs"
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    # two seeds: a job array of two tasks on each cluster (task ids "<cluster>:<job>_<task>")
    res = qualify(
        "sweep", "--sweep", "slurm_ci", BOTH, "train.seed=1,2", f"runs_dir={runs}", f"tracking.uri={uri}", *FAST
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    sweep_id = sweep_id_of(res.stdout)
    st = follow(sweep_id, runs, timeout=300)
    assert st.returncode == 0, st.stdout + st.stderr
    assert "sqlocal2-ci_h100" in st.stdout and "ci_h100" in st.stdout, st.stdout

    points = manifest_of(runs / sweep_id)["points"]
    want = {"ci_h100": "sqlocal", "sqlocal2-ci_h100": "sqlocal2"}
    assert sorted((e["partition"], e["slurm_cluster"]) for e in points) == sorted([*want.items()] * 2)
    arrays: dict[str, set[str]] = {}  # each cluster's array ids
    for e in points:
        cluster, _, task = e["job_id"].partition(":")
        assert "_" in task, e  # an array task
        arrays.setdefault(cluster, set()).add(task.split("_")[0])
    assert {c: len(a) for c, a in arrays.items()} == {"sqlocal": 1, "sqlocal2": 1}, arrays
    runs_by_point = {r.data.tags[K.TAG_POINT_ID]: r for r in point_runs(uri, "slurm-qualify", sweep_id)}
    assert len(runs_by_point) == 4, runs_by_point.keys()
    for entry in points:
        cluster, _, job_id = entry["job_id"].partition(":")
        assert cluster == entry["slurm_cluster"], entry  # each job id is recorded with its cluster
        # the independent reference: the accounting database's own Cluster column
        assert sacct_row(cluster, job_id) == [cluster, "h100", "COMPLETED"]
        outcome = json.loads((Path(entry["point_dir"]) / "outcome.json").read_text())
        assert outcome["outcome"] == "accepted", outcome
        billed = json.loads((Path(entry["point_dir"]) / "billed.json").read_text())
        assert billed.get("source") == "sacct_final", billed  # its bill read from its own cluster's sacct
        run = runs_by_point[entry["point_id"]]
        assert run.data.tags[K.TAG_CLUSTER] == cluster, run.data.tags  # the cluster it ran on

    # a held sweep over both clusters: status sees both pending, cancel reaches both
    res = qualify(
        "sweep",
        "--sweep",
        "slurm_ci",
        BOTH,
        "launcher.hold=true",
        f"runs_dir={runs}",
        "tracking.uri=null",
        *FAST,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    held = sweep_id_of(res.stdout)
    st = qualify("status", "--sweep", held, "--runs-dir", str(runs))
    rows = {line.split()[0]: line.split()[1:3] for line in st.stdout.splitlines() if "ci_h100" in line}
    assert rows.get("sqlocal2-ci_h100") == ["1", "0"] and rows.get("ci_h100") == ["1", "0"], st.stdout
    first_jobs = cancelled(runs, held)
    # resume submits each cancelled point again to its own cluster (held again: its config says
    # so), and a second cancel reaches the new jobs there
    res = qualify("resume", "--sweep", held, "--runs-dir", str(runs))
    assert res.returncode == 0, res.stdout + res.stderr
    again = {e["point_id"]: e for e in manifest_of(runs / held)["points"]}
    assert {p: e["slurm_cluster"] for p, e in again.items()} == {p: c for p, (c, _) in first_jobs.items()}
    assert all(e["job_id"] != ":".join(first_jobs[p]) for p, e in again.items()), again
    cancelled(runs, held)


def cancelled(runs: Path, sweep_id: str) -> dict[str, tuple[str, str]]:
    """`qualify cancel` of a held sweep over both clusters: each job CANCELLED on its own cluster
    (sacct -M), each point `cancelled`. Each point's (cluster, job id)."""
    cancel = qualify("cancel", "--sweep", sweep_id, "--runs-dir", str(runs))
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    jobs = {}
    for entry in manifest_of(runs / sweep_id)["points"]:
        cluster, _, job_id = entry["job_id"].partition(":")
        cluster_col, _, state = sacct_row(cluster, job_id)  # (a job that never started has no Partition)
        assert (cluster_col, state.split()[0]) == (cluster, "CANCELLED")
        outcome = json.loads((Path(entry["point_dir"]) / "outcome.json").read_text())
        assert outcome["reason"] == "cancelled", outcome
        jobs[entry["point_id"]] = (cluster, job_id)
    return jobs


@pytest.mark.slurm
def test_a_cluster_this_login_node_cannot_reach_is_refused_before_submission(
    tmp_path: Path,
    slurm_cluster: None,  # noqa: F811
) -> None:
    runs = tmp_path / "runs"
    res = qualify(
        "sweep", "--sweep", "slurm_ci", BOTH, "partition.slurm_cluster=nosuch", f"runs_dir={runs}",
        "tracking.uri=null", *FAST,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    assert "nosuch" in res.stderr and "nothing was submitted" in res.stderr, res.stderr
    assert "sacctmgr show cluster lists sqlocal, sqlocal2" in res.stderr, res.stderr
    assert not runs.exists() or not list(runs.iterdir()), "a sweep folder was written"
