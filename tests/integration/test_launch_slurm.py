"""`qualify launch --smoke` on the local Slurm (docs/design.md, "Launch"): a one-point sweep, the
winner's launch files, and `sbatch job.sbatch` run to the end through one `scontrol requeue`
mid-run, resumed from the checkpoint the requeue's SIGTERM saved; its MLflow run under the
sweep's parent (sq.kind=production, its restart count), and its smoke report's measured against
projected step time. One rank, a model sized so that 20 steps last long enough to requeue
inside them (about 0.3-1 s a step here)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K
from tests.support.slurm_sweep import JOB_WAIT_S, ONE_RANK, cli_env, manifest_of, qualify, sweep_id_of

SLOW_STEPS = ["model.hidden=128", "model.ffn_hidden=512", "model.n_layers=4", "model.seq_len=256"]


def _wait(path: Path, ok: object, timeout: float, what: str) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            data = json.loads(path.read_text())
            if ok(data):  # type: ignore[operator]
                return dict(data)
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} ({path})")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_smoke_job_runs_through_a_requeue(
    tmp_path: Path, slurm_cluster: None, mlflow_server: str
) -> None:
    runs = tmp_path / "runs"
    out = qualify(
        "sweep", "--sweep", "slurm_ci", "--wait", "partition=ci_a100", ONE_RANK, f"runs_dir={runs}",
        f"tracking.uri={mlflow_server}", "tracking.experiment=launch", "train.steps=10", "train.warmup_steps=2",
        *SLOW_STEPS, timeout=2 * JOB_WAIT_S,
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    sweep_id = sweep_id_of(out.stdout)
    out = qualify(
        "launch", "--sweep", sweep_id, "--runs-dir", str(runs), "--tracking-uri", mlflow_server,
        "--experiment", "launch", "--smoke", "20", "project.tokens=1e7", "project.gpus=1",
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    (folder,) = (runs / sweep_id / "launch").iterdir()
    script = (folder / "job.sbatch").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --partition=a100" in script

    sub = subprocess.run(
        ["sbatch", "--parsable", str(folder / "job.sbatch")], capture_output=True, text=True, env=cli_env()
    )
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    progress = folder / "smoke" / "progress.json"
    _wait(
        progress, lambda p: p.get("phase") == "training" and 2 <= p.get("step", 0) < 18, JOB_WAIT_S, "step 2"
    )
    assert subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True).returncode == 0
    outcome = _wait(
        folder / "smoke" / "outcome.json", lambda o: bool(o.get("outcome")), JOB_WAIT_S, "the end"
    )
    assert outcome["outcome"] == Outcome.ACCEPTED, outcome

    attempts = json.loads((folder / "smoke" / "attempts.json").read_text())
    i = next(i for i, a in enumerate(attempts) if a["stop"] == "terminated")  # the requeue's SIGTERM
    stopped, resumed = attempts[i], attempts[i + 1]
    assert stopped["saved_step"] == stopped["stop_step"] >= 2, attempts
    assert resumed["loaded_step"] == stopped["saved_step"], attempts  # resumed from that save

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("launch")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id], f"tags.`{K.TAG_PARENT_KIND}` = 'production'")
    parent = manifest_of(runs / sweep_id)["parent_run_id"]
    tags = run.data.tags
    assert tags[K.TAG_MLFLOW_PARENT] == parent and tags[K.TAG_OUTCOME] == Outcome.ACCEPTED, tags
    assert int(tags[K.TAG_RESTARTS]) >= 1 and tags[K.TAG_SLURM_JOB_ID] == job, tags

    report = (folder / "smoke.md").read_text()
    row = re.search(r"\| step time \(s\) \| ([\d.e+-]+) \| ([\d.e+-]+) \|", report)
    assert row, report
    projected = json.loads((folder / "launch.json").read_text())["derived"]["step_s"]
    assert float(row.group(1)) == pytest.approx(projected, rel=1e-3) and float(row.group(2)) > 0
