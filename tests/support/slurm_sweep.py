"""What the tests of sweeps on the local Slurm share (test_slurm_sweep, test_slurm_scaling,
test_status_slurm): the real CLI as a user runs it, the sweep id it prints, the manifest it
writes and the point runs it logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from pipeline.tracking import keys as K

REPO = Path(__file__).resolve().parents[2]
JOB_WAIT_S = 300  # bound on a sweep's jobs (each takes 10-25 s on an idle cluster)
TINY = ["train.steps=10", "train.warmup_steps=2"]  # enough to pass the loss bound, fast
ONE_RANK = "parallelism.gpus_per_node=1"
"""A job of one rank, for the tests of a sweep's plumbing on Slurm (arrays, status, cancel and
resume, queue waits, clusters): a second rank proves nothing more there (the drills, the
two-node, scaling and health tests run several), and on 2 cores it doubles a job's start-up.
Measured here, idle: the three-partition fan-out took 91 s and 150 busy core-s with 2 ranks
per job, 59 s and 91 core-s with one."""


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    # the venv's bin first (DeepSpeed's op cache), MLflow given time under a loaded server
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "3"
    env["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "30"
    return env


def qualify(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real entry point, as a user runs it (`env`: variables added to the environment)."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        cwd=REPO,
        env={**cli_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def follow(
    sweep_id: str, runs: Path, timeout: float, interval_s: int = 2, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`qualify status --follow` of a sweep to its end, polling every `interval_s` (the default
    30 s would sleep most of a short test away)."""
    return qualify(
        "status", "--sweep", sweep_id, "--runs-dir", str(runs), "--follow", "--interval", str(interval_s),
        timeout=timeout, env=env,
    )  # fmt: skip


def sweep_id_of(out: str) -> str:
    m = re.search(r"sweep id: (\S+)", out)
    assert m, f"no sweep id printed:\n{out}"
    return m.group(1)


def manifest_of(sweep_dir: Path) -> dict[str, Any]:
    return dict(json.loads((sweep_dir / "manifest.json").read_text()))


def point_runs(uri: str, experiment: str, sweep_id: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment} on {uri}"
    return list(
        client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.`{K.TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{K.TAG_PARENT_KIND}` = 'point'",
        )
    )
