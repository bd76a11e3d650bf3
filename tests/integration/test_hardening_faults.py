"""Hardening, second round (issue #25): the faults and commands a careless user or a faulty
environment meets, each refused or handled as docs/hardening.md says. The bad-input table
(tests/unit/test_bad_input.py) holds the one-override refusals; this file the rest."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.cli import main
from tests.support.helpers import PY, REPO

FAKE_NVML = (
    "tests.support.fake_nvml"  # tests/support/fake_nvml.py: pynvml's interface with GPUs of a chosen name
)


# --------------------------------------------------------------------------------------------
# a CPU run is never recorded as a GPU (README's promise)


def test_a_cpu_run_is_never_recorded_as_a_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #25 item 3: partition=a100 on the local launcher of a machine without an A100
    trained on the CPU and ended accepted as candidate a100/..., at the A100 price. Refused."""
    runs = tmp_path / "runs"
    rc = main(["sweep", "--sweep", "smoke", "--launcher", "local", "partition=a100", f"runs_dir={runs}",
               f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "partition=a100" in err and "partition=local" in err and "recorded as a100" in err, err
    assert not runs.exists() and not (tmp_path / "m.db").exists()


def test_a_gpu_partition_runs_locally_where_that_gpu_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The refusal asks NVML: a machine with the partition's GPU (the fake NVML's A100s here)
    plans the point; a machine with other GPUs is refused, naming them."""
    from pipeline.config.schema import ConfigError
    from pipeline.submit.sweep import plan

    monkeypatch.setenv("SQ_NVML_MODULE", FAKE_NVML)
    monkeypatch.setenv("SQ_FAKE_NVML_NAME", "NVIDIA A100-SXM4-80GB")
    pl = plan("smoke", ["partition=a100", f"runs_dir={tmp_path}"], launcher_kind="local")
    assert pl.launcher == "local" and pl.points[0].cfg.partition.gpu_type == "a100"
    monkeypatch.setenv("SQ_FAKE_NVML_NAME", "NVIDIA L40S")
    with pytest.raises(ConfigError, match=r"partition=h100 .* this machine has NVIDIA L40S"):
        plan("smoke", ["partition=h100", f"runs_dir={tmp_path}"], launcher_kind="local")


# --------------------------------------------------------------------------------------------
# tracebacks that are exit 2 now (item 5)


def test_a_config_json_that_is_a_list_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("[1, 2, 3]")
    rc = main(["sweep", "--sweep", "smoke", "--launcher", "local", f"model.pretrained={model}",
               f"runs_dir={tmp_path / 'runs'}"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "model.pretrained" in err and "JSON list" in err and "Traceback" not in err, err


def test_the_projection_does_not_grow_with_the_run() -> None:
    """project.tokens=1e15 took 52 s and 658 MB (one list item per checkpoint interval). The
    expectation is now the count of full segments times one segment's, checked against the
    segment-by-segment sum on a run small enough to list, and timed on a huge one."""
    import time

    from pipeline.measure.projection import RunModel, expected_segment_s, expected_wall_s

    run = RunModel(
        work_s=1000.5, gpus=64, rate_per_gpu_hour=1e-3, ckpt_stall_s=7.0, restart_s=90.0, start_s=30
    )
    lam = run.rate_per_s
    by_hand = run.start_s + sum(expected_segment_s(w + 7.0, 90.0, lam) for w in [100.0] * 10 + [0.5])
    assert expected_wall_s(run, 100.0) == pytest.approx(by_hand, rel=1e-12)
    huge = RunModel(work_s=3e13, gpus=64, rate_per_gpu_hour=1e-6, ckpt_stall_s=7.0, restart_s=90.0)
    t0 = time.perf_counter()
    wall = expected_wall_s(huge, 1.0)  # 3e13 segments: a list of them would never fit in memory
    assert time.perf_counter() - t0 < 0.01 and wall > huge.work_s


@pytest.mark.parametrize(
    ("target", "key"),
    [("project.tokens=1e300", "project.tokens"), ("project.gpus=inf", "project.gpus"),
     ("project.gpus=1e30", "project.gpus"), ("project.deadline_h=1e300", "project.deadline_h")],
)  # fmt: skip
def test_the_report_refuses_a_projection_past_its_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, target: str, key: str
) -> None:
    """project.tokens=1e300 was an OverflowError traceback; now exit 2 naming the key, before
    any store is opened (none is created)."""
    monkeypatch.setenv("SQ_HOME", str(tmp_path))
    args = [target, *(a for a in ("project.tokens=1e10", "project.gpus=8") if not a.startswith(key))]
    rc = main(["report", *args])
    err = capsys.readouterr().err
    assert rc == 2 and key in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------
# smaller ones (item 9)


@pytest.mark.parametrize("command", ["report", "baseline"])
def test_reading_a_sweep_that_does_not_exist_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """`make report`/`make baseline` on a new project created mlruns.db; now exit 2, nothing."""
    monkeypatch.setenv("SQ_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rc = main([command, "--sweep", "20990101-000000-abcd"])
    err = capsys.readouterr().err
    assert rc == 2 and "no MLflow store" in err, err
    assert list(tmp_path.iterdir()) == [], "a reader created a file"


def test_make_ui_refuses_a_taken_port(tmp_path: Path) -> None:
    """`make ui` exited 0 when its port was taken (MLflow's server only logged it)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed").touch()
    (venv / "bin" / "python").symlink_to(PY)
    (venv / "bin" / "mlflow").write_text("#!/bin/sh\necho started\n")
    (venv / "bin" / "mlflow").chmod(0o755)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run(
            ["make", "-s", "-C", str(REPO), "-o", f"{venv}/.installed", "ui", f"VENV={venv}", f"PORT={port}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert res.returncode != 0 and "started" not in res.stdout, res.stdout + res.stderr
    assert f"127.0.0.1:{port} is taken" in res.stderr and f"PORT={port + 1}" in res.stderr, res.stderr


def test_no_sqlite_store_is_tracked_in_git() -> None:
    """A `mlflow.db` test store was committed at the repository root; *.db is ignored now."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "*.db"], capture_output=True, text=True)
    assert tracked.stdout == ""
    ignored = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "mlflow.db", "mlruns.db", "runs/x/store.db"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert ignored.stdout.split() == ["mlflow.db", "mlruns.db", "runs/x/store.db"]


def test_the_project_home_follows_the_checkout_the_command_runs_in(tmp_path: Path) -> None:
    """With a venv made in another checkout (its editable install points there), `make sweep`
    in this checkout wrote into that one. The home is now the checkout of the working folder."""
    other = tmp_path / "other-checkout"
    (other / "conf").mkdir(parents=True)
    (other / "conf" / "config.yaml").write_text("defaults: []\n")
    (other / "pyproject.toml").write_text('[project]\nname = "slurm-qualify"\n')
    (other / "sub").mkdir()
    code = "from pipeline.home import project_home; print(project_home())"
    env = {k: v for k, v in os.environ.items() if k != "SQ_HOME"}
    env["PYTHONPATH"] = str(REPO)  # the package from this repository, as an editable install gives it
    for cwd in (other, other / "sub"):
        out = subprocess.run([PY, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == str(other.resolve())
    elsewhere = subprocess.run(
        [PY, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert elsewhere.stdout.strip() == str(REPO.resolve()), "outside any checkout: the package's own"


def test_the_summary_says_when_mlflow_stopped_answering(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MLflow answered at the start and died partway: the notice was only in the job log. The
    sweep's summary now counts the ledgers with unsent events and gives the `make sync` line."""
    from pipeline.cli import _say_unsent
    from pipeline.tracking.ledger import Tracker, unsent_ledgers

    point = tmp_path / "points" / "p0000" / "tracking"
    t = Tracker("http://127.0.0.1:9", "e", point, run_name="r", offline=True, background=False)
    t.log_metrics({"x": 1.0}, step=1)
    t.close()
    assert unsent_ledgers(tmp_path) == [point]
    _say_unsent(tmp_path, "SWEEP-ID")
    out = capsys.readouterr().out
    assert "MLflow stopped answering during the sweep: 1 run(s)" in out and "make sync SWEEP=SWEEP-ID" in out
    (point / "ledger.synced").write_text(str(len((point / "ledger.jsonl").read_text().splitlines())))
    assert unsent_ledgers(tmp_path) == []


# --------------------------------------------------------------------------------------------
# checkpoints (item 8)


def test_a_manifest_that_lists_no_files_fails_verification(tmp_path: Path) -> None:
    from pipeline.train.checkpoint import check_manifest

    for manifest in ({"files": {}}, {"files": {"x.pt": {"bytes": 1, "crc32": "0"}}}, [], {"files": []}):
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))
        assert check_manifest(tmp_path) is not None, manifest


# --------------------------------------------------------------------------------------------
# SIGHUP ends a local sweep as Ctrl-C does (item 9)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sighup_ends_a_local_sweep_killed(tmp_path: Path) -> None:
    """The terminal of a local sweep closes (SIGHUP to its process group): the points end
    failed `interrupted` and the parent run KILLED, as after Ctrl-C (it ended FINISHED)."""
    import signal
    import time

    from mlflow.tracking import MlflowClient

    runs, uri = tmp_path / "runs", f"sqlite:///{tmp_path / 'm.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "sweep", "--sweep", "smoke", "--launcher", "local",
         f"runs_dir={runs}", f"tracking.uri={uri}", "train.seed=1,2", "train.steps=400"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    deadline, manifest = time.monotonic() + 180, {}
    while time.monotonic() < deadline:
        found = list(runs.glob("*/manifest.json"))
        manifest = json.loads(found[0].read_text()) if found else {}
        if manifest.get("points") and manifest["points"][0]["job_id"]:
            break
        time.sleep(0.5)
    time.sleep(5)
    os.killpg(proc.pid, signal.SIGHUP)
    out, _ = proc.communicate(timeout=120)
    assert "[sweep] interrupted" in out, out
    outcomes = [json.loads((Path(p["point_dir"]) / "outcome.json").read_text()) for p in manifest["points"]]
    assert [(o["outcome"], o["reason"]) for o in outcomes] == [("failed", "interrupted")] * 2, outcomes
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("slurm-qualify")
    kinds = sorted(
        (r.data.tags.get("sq.kind"), r.info.status) for r in client.search_runs([exp.experiment_id])
    )
    assert kinds == [("point", "KILLED"), ("point", "KILLED"), ("sweep", "KILLED")], kinds


def test_every_test_docs_hardening_names_exists() -> None:
    """docs/hardening.md backs each class and promise with a named test: every name exists."""
    import re

    text = (REPO / "docs" / "hardening.md").read_text()
    named = set(re.findall(r"`(?:[\w/.]+::)?(test_\w+)`", text)) | set(re.findall(r"[HF] `(test_\w+)`", text))
    defined = {
        m
        for f in (REPO / "tests").rglob("test_*.py")
        for m in re.findall(r"^def (test_\w+)", f.read_text(), re.M)
    }
    assert len(named) >= 20 and named <= defined, sorted(named - defined)
