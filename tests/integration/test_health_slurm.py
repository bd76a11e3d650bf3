"""Telemetry and the node health gate on the local Slurm (cluster/cluster.sh up): a 2-node run
logs host telemetry for each node it ran on; a node with an uncorrected ECC error (the fake
NVML, tests/support/fake_nvml.py, marks the first node a point lands on) ends the point as
node_unhealthy, and with launcher.exclude_unhealthy=true the login node submits it again
without that node, where it is accepted.

Run: .venv/bin/python -m pytest tests/integration/test_health_slurm.py   (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K
from tests.support.slurm_sweep import ONE_RANK

REPO = Path(__file__).resolve().parents[2]
TINY = ["train.steps=10", "train.warmup_steps=2", "train.measure_comm=false", "telemetry.interval_s=0.5"]


def _qualify(args: list[str], env: dict[str, str], timeout: float = 400) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    e["PATH"] = f"{Path(sys.executable).parent}:{e.get('PATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "sweep", "--sweep", "slurm_ci", "--wait", *args],
        cwd=REPO,
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _point(runs: Path, out: str) -> tuple[str, dict[str, Any]]:
    m = re.search(r"sweep id: (\S+)", out)
    assert m, out
    (point,) = json.loads((runs / m.group(1) / "manifest.json").read_text())["points"]
    return m.group(1), point


def _run(uri: str, experiment: str) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id], "tags.`sq.kind` = 'point'")
    return run


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_node_run_logs_host_telemetry_per_node(tmp_path: Path, slurm_cluster: None) -> None:
    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlruns.db'}"
    out = _qualify(
        [
            "partition=ci_h100",
            "parallelism.nodes=2",
            "parallelism.gpus_per_node=1",
            f"runs_dir={runs}",
            f"tracking.uri={uri}",
            "tracking.experiment=telemetry",
            *TINY,
        ],
        {},
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    run = _run(uri, "telemetry")
    m = run.data.metrics
    for node in ("h100-1", "h100-2"):
        assert f"sys/{node}/cpu_utilization_pct" in m and f"sys/{node}/memory_used_gib" in m, sorted(m)
        assert run.data.tags[f"{K.TAG_HEALTH_NODE_PREFIX}{node}"] == "healthy"
    assert not any("/gpu" in k for k in m if k.startswith("sys/"))  # no NVML here: no GPU keys


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_unhealthy_node_is_excluded_and_the_point_accepted(tmp_path: Path, slurm_cluster: None) -> None:
    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'mlruns.db'}"
    bad = tmp_path / "bad_node"  # the first node that reads it is the one with the ECC error
    out = _qualify(
        [
            "partition=ci_a100",
            ONE_RANK,  # the node's health is under test, not the ranks
            "launcher.exclude_unhealthy=true",
            f"runs_dir={runs}",
            f"tracking.uri={uri}",
            "tracking.experiment=exclude",
            *TINY,
        ],
        {
            "SQ_NVML_MODULE": "tests.support.fake_nvml",
            "SQ_FAKE_NVML_GPUS": "4",
            "SQ_FAKE_NVML_ECC_FILE": str(bad),
        },
        timeout=560,
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    node = bad.read_text().strip()
    assert node in ("a100-1", "a100-2"), node
    other = ({"a100-1", "a100-2"} - {node}).pop()
    # the sweep says it (a log line of the qualify command, on its stderr)
    assert f"node_unhealthy on {node}: submitted again as job" in out.stderr, out.stdout + out.stderr
    _, point = _point(runs, out.stdout)
    attempts = json.loads((Path(point["point_dir"]) / "attempts.json").read_text())
    assert [a.get("unhealthy_nodes") for a in attempts] == [[node], None], attempts
    assert [a["outcome"] for a in attempts] == [Outcome.FAILED, Outcome.ACCEPTED]
    outcome = json.loads((Path(point["point_dir"]) / "outcome.json").read_text())
    assert outcome["outcome"] == Outcome.ACCEPTED, outcome
    run = _run(uri, "exclude")
    tags = run.data.tags
    # the first attempt's gate, in the run's tags: the node, its verdict and the finding
    assert tags[K.TAG_UNHEALTHY_NODES] == node
    assert (
        tags[f"{K.TAG_HEALTH_NODE_PREFIX}{node}"]
        == "failed: GPU 0: 1 uncorrected ECC error(s) since the driver loaded"
    )
    assert tags[f"{K.TAG_HEALTH_NODE_PREFIX}{other}"] == "healthy" and tags[K.TAG_HEALTH] == "healthy"
    assert run.data.tags[K.TAG_SLURM_NODENAME] == other
    assert run.data.tags[K.TAG_OUTCOME] == Outcome.ACCEPTED
    # the resubmitted job asked Slurm to leave the bad node out
    script = Path(runs).glob(f"*/submitit/{point['job_id']}_submission.sh")
    assert any(f"#SBATCH --exclude={node}" in p.read_text() for p in script)
