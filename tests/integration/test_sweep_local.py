"""The embedded default, end to end: the real `qualify sweep` CLI on the local executor, every
point a child run in MLflow with its outcome, read back through the MLflow API."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.config.compose import compose_sweep
from pipeline.config.validate import memory_estimate
from pipeline.contract.pointdir import PointDir
from pipeline.sched.warm import SHARED_ENV
from pipeline.tracking import keys as K
from tests.support.helpers import point_runs, qualify, summary_row, with_default_sigint

ACCEPTED_METRICS = [
    "perf/tokens_per_s",
    "perf/step_time_p50_s",
    "perf/step_time_p95_s",
    "perf/step_time_cv",
    "perf/mfu_vs_measured_ceiling",
    "mem/peak_rss_gib",
    "ckpt/save_s",
    "ckpt/load_s",
    "ckpt/bytes",
    "ckpt/verified",
    "restart/cold_start_s",
]


@pytest.mark.slow
def test_default_sweep_end_to_end(
    tmp_path: Path, sqlite_uri: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the embedded default as a user runs it: the sweep starts its own warm server, not the
    # one the other tests share (tests/support/warm_server.py)
    monkeypatch.delenv(SHARED_ENV, raising=False)
    runs = tmp_path / "runs"
    res = qualify(
        [
            "sweep",
            "--sweep",
            "default",
            "--launcher",
            "local",
            f"runs_dir={runs}",
            f"tracking.uri={sqlite_uri}",
        ]
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    first, second = res.stdout.splitlines()[:2]
    assert first.startswith("estimate: 6 points, "), res.stdout[:500]  # what it will cost, before anything
    assert second.startswith("launcher: local"), "the launcher is said in one line at the start"
    assert "MLflow:" in res.stdout and "make ui" in res.stdout

    (sweep_dir,) = list(runs.iterdir())
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    children = point_runs(sqlite_uri)
    assert len(children) == len(manifest["points"]) == 6
    parent_ids = {r.data.tags["mlflow.parentRunId"] for r in children}
    assert parent_ids == {manifest["parent_run_id"]}

    by_precision: dict[str, list] = {}
    for r in children:
        by_precision.setdefault(r.data.params["precision.name"], []).append(r)
    for r in by_precision["fp32"] + by_precision["bf16"]:
        assert r.data.tags["sq.outcome"] == "accepted", (
            r.data.tags.get("sq.reason"),
            r.data.tags.get("sq.reason_detail"),
        )
        for key in ACCEPTED_METRICS:
            assert key in r.data.metrics, (r.data.tags["sq.point_id"], key)
        assert r.data.metrics["ckpt/verified"] == 1.0
        # warm ranks (docs/design.md, "Warm ranks"): every rank forked by the sweep's server,
        # labelled so, with what its imports took (they ran once, before any point)
        assert r.data.tags["sq.ranks"] == "warm", r.data.tags
        assert r.data.metrics["startup/warm_import_s"] > 0.5
        # the cold start (process start to the first step done) holds every start-up part, and
        # less than a few seconds more (the probes and the first step)
        parts = sum(
            r.data.metrics[f"startup/{p}_s"]
            for p in ("import", "process_group", "model_build", "engine_init", "ckpt_load")
        )
        assert parts <= r.data.metrics["restart/cold_start_s"] <= parts + 30, (parts, r.data.metrics)
        assert r.data.metrics["train/final_loss"] < r.data.metrics["train/loss_bound"]
        assert r.data.params["parallelism.zero_stage"] in {"1", "2", "3"}
        assert r.data.tags["sq.candidate"].startswith("local/tiny/")
        host = os.uname().nodename  # issue 36: the local launcher's cluster is this host
        assert r.data.tags[K.TAG_CLUSTER] == f"local-{host}" and r.data.tags[K.TAG_CLUSTER_CONTROLLER] == host
        # the memory model against the tensors each run really holds, ZeRO 1-3, fp32 and bf16
        ratio = r.data.metrics["mem/states_measured_over_predicted"]
        if r.data.params["parallelism.zero_stage"] != "3":
            assert 0.95 <= ratio <= 1.05, (r.data.tags["sq.point_id"], ratio)
        # ZeRO-3 on this tiny model: every tensor is under stage3_param_persistence_threshold, so
        # each rank holds whole copies beside its partitions; fp32 measures 1.25x the model there
        # (docs/memory.md). On real model sizes the persistent share is negligible.
    # the summary table names every point with its outcome
    for p in manifest["points"]:
        assert re.search(r"\saccepted\s", summary_row(res.stdout, p["point_id"])), res.stdout

    # the sweep was waited for: every point has its outcome, the one expected of it
    expected = {p["point_id"]: "accepted" for p in manifest["points"]}
    assert len(expected) == 6
    got = {}
    for p in manifest["points"]:
        o = json.loads((Path(p["point_dir"]) / "outcome.json").read_text())
        got[p["point_id"]] = o["outcome"] + (f": {o['reason']}" if o["outcome"] != "accepted" else "")
        if got[p["point_id"]] != expected[p["point_id"]]:
            print(f"{p['point_id']}: {o['outcome']} ({o.get('reason')}: {o.get('detail')})")
    assert got == expected

    assert cli.main(["status", "--runs-dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "all     [########################] 6/6" in out


def test_gpu_anchor_plans_with_memory_verdicts() -> None:
    """The real-cluster preset composes, and the memory model judges each point before any
    submission (does a 13B fit on 4 x 80 GB with ZeRO-2?)."""
    points = compose_sweep("gpu_anchor")
    assert len(points) == 3 * 2 * 2
    verdicts = {
        (p.cfg.partition.name, p.cfg.model.name, p.cfg.parallelism.zero_stage): memory_estimate(p.cfg).verdict
        for p in points
    }
    # ZeRO-3 over 4 GPUs shards the 16 bytes/param: 7B -> 28 GB of states per GPU, fits on 80 GB
    assert verdicts[("a100", "llama-7b", 3)] == "fits"
    # ZeRO-2 keeps 2 bytes/param of weights whole plus 14/4: 13B -> ~71 GB on an 80 GB A100
    assert verdicts[("a100", "llama-13b", 2)] == "does_not_fit"
    assert verdicts[("h200", "llama-13b", 3)] == "fits"


def test_show_lists_points_without_submitting(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", "--sweep", "smoke", "--full"]) == 0
    out = capsys.readouterr().out
    assert out.count("# p0000-local-tiny-full-fp32-zero2") == 1 and out.count("# p") == 1
    assert out.count("\nprecision:\n") == 1, "--full prints the resolved config"


def test_show_refuses_bad_input_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["show", "--sweep", "smoke", "precision=fp8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "precision" in err and "\n\n" not in err.strip()


def test_list_names_every_group_and_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.home import conf_dir

    assert cli.main(["list"]) == 0
    listed = {ln.split()[0]: ln.split()[1:] for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    groups = {g.name: sorted(f.stem for f in g.glob("*.yaml")) for g in conf_dir().iterdir() if g.is_dir()}
    assert listed == groups
    assert {"model", "precision", "parallelism", "partition", "drill", "sweep"} <= set(listed)
    assert "smoke" in listed["sweep"] and "timeout" in listed["drill"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_ends_a_local_sweep_interrupted(tmp_path: Path, sqlite_uri: str) -> None:
    """Ctrl-C on `make sweep` (SIGINT to the terminal's process group) while the first of two local points
    trains: the command prints the running point's phases as they come (starting ..., training
    step k/n with its pace and the sweep's time left), then exits 130 with one line on stderr
    and no traceback; both points end failed `interrupted`, their runs and the parent KILLED;
    `qualify status` then returns at once with 2/2 ended."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from mlflow.tracking import MlflowClient

    runs = tmp_path / "runs"
    repo = Path(__file__).resolve().parents[2]
    venv = Path(sys.executable).parent.parent  # the venv running the tests (make's VENV)
    args = f"launcher.kind=local runs_dir={runs} tracking.uri={sqlite_uri} train.seed=1,2 train.steps=4000"
    proc = subprocess.Popen(  # as the user types it: make sweep, in the terminal's process group
        with_default_sigint(["make", "-o", f"{venv}/.installed", "sweep", "SWEEP=smoke", f"VENV={venv}", f"ARGS={args}"]),
        cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    manifest: dict = {}
    progress: dict = {}
    while time.monotonic() < deadline:  # the first point trains (its rank 0 says so)
        found = list(runs.glob("*/manifest.json"))
        manifest = json.loads(found[0].read_text()) if found else {}
        if manifest.get("points") and manifest["points"][0]["job_id"]:
            progress = PointDir(manifest["points"][0]["point_dir"]).read_progress() or {}
            if progress.get("phase") == "training" and progress.get("step", 0) >= 2:
                break
        time.sleep(0.5)
    assert progress.get("steps") == 4000 and progress.get("step_time_s", 0) > 0, progress
    time.sleep(2)  # the sweep has printed the step line
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    # make dies of the SIGINT it got itself, after the command's exit 130: the shell's 130
    assert proc.returncode == -signal.SIGINT, (proc.returncode, out, err)
    assert "make:" not in err, err  # make's own "*** [Makefile:N: sweep] Interrupt" is not printed
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("[sweep] interrupted: "), err
    assert "2 of 2 point(s) ended failed (interrupted)" in lines[0], lines
    first = manifest["points"][0]["point_id"]
    said = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(f"{first}: ")]
    assert any(": starting" in ln for ln in said), out
    assert any(": training step " in ln and "s/step; sweep time left: about " in ln for ln in said), out
    outcomes = [json.loads((Path(p["point_dir"]) / "outcome.json").read_text()) for p in manifest["points"]]
    assert [(o["outcome"], o["reason"]) for o in outcomes] == [("failed", "interrupted")] * 2, outcomes
    t0 = time.monotonic()
    assert cli.main(["status", "--runs-dir", str(runs), "--follow", "--interval", "1"]) == 0
    assert time.monotonic() - t0 < 10, "status returns: no point stays unknown"
    client = MlflowClient(sqlite_uri)
    exp = client.get_experiment_by_name("slurm-qualify")
    statuses = sorted(
        (r.data.tags.get("sq.kind"), r.info.status) for r in client.search_runs([exp.experiment_id])
    )
    assert statuses == [("point", "KILLED"), ("point", "KILLED"), ("sweep", "KILLED")], statuses
