"""The report and the MLflow UI, opened in headless Chromium (Debian's, installed by .ci/run).

Method: `chromium --headless --dump-dom` prints the DOM after the page's load event (and
`--virtual-time-budget` lets an app's scripts and fetches finish first); with
`--enable-logging=stderr --v=0` every console message goes to stderr as an INFO:CONSOLE line.
The report sets <body data-images-ok="true"> once every <img> decoded (naturalWidth > 0), so
the dumped DOM says whether all plots loaded. Negative controls check that a broken image and
a script error are detected. No DevTools protocol, no extra Python package.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from analysis.plots import Plot, Section, render_html
from analysis.report import report_main
from pipeline.submit.manifest import MANIFEST
from tests.support.analysis_helpers import FAKE_REFERENCES, make_fake_sweep
from tests.support.slurm_fixtures import server_env

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CONSOLE = re.compile(r":INFO:CONSOLE[:(]")


@pytest.fixture(scope="module")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing; CI installs Debian's chromium (.ci/run)")
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium)")
    return CHROMIUM


def browse(
    chromium: str, profile: Path, *args: str, budget_ms: int = 3000
) -> subprocess.CompletedProcess[str]:
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",  # runs as root here
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,2000",
        f"--virtual-time-budget={budget_ms}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE.search(line)]


def body_attrs(dom: str) -> dict[str, str]:
    m = re.search(r"<body([^>]*)>", dom)
    assert m, dom[:500]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    w, h = struct.unpack(">II", head[16:24])
    return w, h


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    """A fake sweep in a SQLite store, reported: (uri, experiment id, html path)."""
    tmp = tmp_path_factory.mktemp("browser")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    sweep = make_fake_sweep(uri)
    refs = tmp / "refs.yaml"
    refs.write_text(FAKE_REFERENCES)
    assert report_main(["--tracking-uri", uri, "--out", str(tmp / "out"), "--references", str(refs)]) == 0
    return uri, sweep.experiment_id, tmp / "out" / "report.html"


def check_page(chromium: str, page: Path, tmp_path: Path, images: int) -> None:
    """Renders with no console message, every image decoded, and a non-blank screenshot."""
    done = browse(chromium, tmp_path / "p1", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert console_lines(done.stderr) == []
    attrs = body_attrs(done.stdout)
    assert attrs.get("data-images") == str(images) and attrs.get("data-images-ok") == "true", attrs
    assert "Recommendation" in done.stdout and "Problems" in done.stdout
    shot = tmp_path / "report.png"
    done = browse(chromium, tmp_path / "p2", "--hide-scrollbars", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert png_size(shot) == (1400, 2000) and shot.stat().st_size > 50_000  # a rendered page, not blank
    keep = os.environ.get("SQ_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, Path(keep) / f"{page.parent.parent.name}-report.png")


def test_report_renders_with_every_plot_and_no_console_error(
    chromium: str, report: tuple[str, str, Path], tmp_path: Path
) -> None:
    check_page(chromium, report[2], tmp_path, images=6)


@pytest.mark.slow
def test_report_of_a_real_local_sweep(chromium: str, tmp_path: Path) -> None:
    """`qualify sweep --sweep smoke` (real DeepSpeed ranks on this CPU), then the report as
    `make report` runs it, then the page in Chromium."""
    from mlflow.tracking import MlflowClient

    from tests.support.helpers import qualify

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    # the experiment first, so artifacts stay in tmp_path (MLflow's default is ./mlruns)
    MlflowClient(tracking_uri=uri).create_experiment("slurm-qualify", (tmp_path / "artifacts").as_uri())
    res = qualify(
        [
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            f"runs_dir={tmp_path / 'runs'}",
            f"tracking.uri={uri}",
        ]
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = tmp_path / "report"
    cmd = [sys.executable, "-m", "analysis.report", "--tracking-uri", uri, "--out", str(out)]
    done = subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    md = (out / "report.md").read_text()
    assert "| local/tiny/full/fp32/zero2" in md and "1 accepted" in md and "$0.05/GPU-h (2026-11-01" in md
    check_page(
        chromium, out / "report.html", tmp_path, images=len(list((out / "report_plots").glob("*.png")))
    )


def test_the_checks_catch_a_broken_image_and_a_script_error(chromium: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text(render_html("broken", [Section("x", [Plot("p", "p", b"not a png")])]))
    done = browse(chromium, tmp_path / "p1", "--dump-dom", broken.as_uri())
    assert body_attrs(done.stdout).get("data-images-ok") == "false"
    error = tmp_path / "error.html"
    error.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    done = browse(chromium, tmp_path / "p2", "--dump-dom", error.as_uri())
    assert any("Uncaught ReferenceError" in line for line in console_lines(done.stderr)), done.stderr[-2000:]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mlflow_ui(uri: str, cwd: Path) -> Iterator[str]:
    """`mlflow server` (the app `make ui` runs) on a free port over `uri`: its base URL."""
    port = _free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow), "server", "--backend-store-uri", uri, "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        [*cmd, "--workers", "1"],
        cwd=cwd,
        env=server_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, "mlflow server exited"
            assert time.monotonic() < deadline, "mlflow server did not answer /health in 90 s"
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def visible_text(html: str) -> str:
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S))
    return " ".join(text.split())  # the visible text, whitespace collapsed


@pytest.mark.slow
def test_mlflow_ui_shows_the_sweep_runs_their_tags_and_the_report(
    chromium: str, report: tuple[str, str, Path], tmp_path: Path
) -> None:
    uri, exp_id, _ = report
    with mlflow_ui(uri, tmp_path) as base:

        def dom(path: str, profile: str) -> str:
            done = browse(chromium, tmp_path / profile, "--dump-dom", f"{base}/{path}", budget_ms=15000)
            errors = [
                x for x in console_lines(done.stderr) if "Uncaught" in x or "Failed to load resource" in x
            ]
            assert errors == [], errors
            return visible_text(done.stdout)

        runs_page = dom(f"#/experiments/{exp_id}/runs", "ui1")
        assert "sweep-20261129-171500-ab12" in runs_page  # the parent; children are nested under it
        assert re.search(r"\b14 matching runs\b", runs_page), runs_page[-2000:]

        child = _run_id(base, exp_id, "h100-a-1")
        run_page = dom(f"#/experiments/{exp_id}/runs/{child}", "ui2")
        for text in (
            "sq.partition : h100",
            "sq.outcome : accepted",
            "sq.verdict : pass",
            "sq.ref.perf/tokens_per_s : pass",
        ):
            assert text in run_page, text

        parent = _run_id(base, exp_id, "sweep-20261129-171500-ab12")
        artifacts = dom(f"#/experiments/{exp_id}/runs/{parent}/artifacts", "ui3")
        assert "report" in artifacts.split() and MANIFEST in artifacts


def _run_id(base: str, exp_id: str, name: str) -> str:
    """The run id by name, through the REST API the UI itself calls."""
    import json

    body = json.dumps({"experiment_ids": [exp_id], "filter": f"attributes.run_name = '{name}'"}).encode()
    req = urllib.request.Request(
        f"{base}/ajax-api/2.0/mlflow/runs/search", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        runs = json.load(r)["runs"]
    assert len(runs) == 1, runs
    return str(runs[0]["info"]["run_id"])


DECISION_COLUMNS = (
    "sq.outcome",
    "perf/tokens_per_s",
    "perf/mfu",
    "mem/peak_allocated_gib",
    "restart/total_s",
    "candidate/usd_per_finished_run",
    "candidate/usd_per_successful_checkpoint",
)


@pytest.mark.slow
def test_make_ui_lands_on_the_sweep_runs_with_the_decision_columns(
    chromium: str, report: tuple[str, str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The URL `make ui` prints (`qualify ui-url`) opens the model-training runs table of the
    sweep: its 13 child runs (not the parent), fastest first, with the decision's columns, the
    candidates' costs that `make report` logged on them among them."""
    from pipeline import cli
    from pipeline.submit.manifest import Manifest
    from pipeline.tracking.view import view_key

    uri, exp_id, _ = report
    sweep_id = "20261129-171500-ab12"
    runs = tmp_path / "runs"
    (runs / sweep_id).mkdir(parents=True)
    Manifest(sweep_id, "fake", "2026-11-29T17:15:00", "slurm", uri, "slurm-qualify", []).write(
        runs / sweep_id
    )
    with mlflow_ui(uri, tmp_path) as base:
        port = base.rsplit(":", 1)[1]
        assert cli.main(["ui-url", "--runs-dir", str(runs), "--port", port]) == 0
        url = capsys.readouterr().out.split(": ", 1)[1].strip()
        assert url == (
            f"{base}/#/experiments/{exp_id}/runs?viewStateShareKey={view_key(sweep_id)}"
            "&compareRunsMode=TABLE&workflowType=machine_learning"
        )
        done = browse(
            chromium, tmp_path / "v1", "--window-size=2400,1200", "--dump-dom", url, budget_ms=20000
        )
        errors = [x for x in console_lines(done.stderr) if "Uncaught" in x or "Failed to load resource" in x]
        assert errors == [], errors
        page = visible_text(done.stdout)
        assert "You're viewing a shared view" in page, page[:2000]
        # the "Model training" side: its navigation (Runs, Models, Model registry), not GenAI's
        assert "Model registry" in page and "Observability" not in page, page[:2000]
        assert re.search(r"\b13 matching runs\b", page), page[-2000:]
        assert "sweep-20261129-171500-ab12" not in page  # the parent is not a row
        for column in DECISION_COLUMNS:
            assert column in page, column
        names = re.findall(r"\b((?:a100|h100|h200|l40s)-[a-z0-9]+-\d)\b", page)
        assert names[:2] == ["a100-1b-2", "a100-1b-1"], names  # 41000 and 40000 tokens/s first
        shot = tmp_path / "ui.png"
        args = ("--window-size=2400,1200", "--hide-scrollbars", f"--screenshot={shot}", url)
        done = browse(chromium, tmp_path / "v2", *args, budget_ms=20000)
        assert done.returncode == 0 and png_size(shot) == (2400, 1200) and shot.stat().st_size > 50_000
        keep = os.environ.get("SQ_SCREENSHOT_DIR")
        if keep:
            shutil.copy(shot, Path(keep) / "mlflow-ui-runs.png")
        # the parent's description: the report's decision and candidates, rendered from Markdown
        parent = _run_id(base, exp_id, f"sweep-{sweep_id}")
        done = browse(chromium, tmp_path / "v3", "--dump-dom", f"{base}/#/experiments/{exp_id}/runs/{parent}",
                      budget_ms=20000)  # fmt: skip
        described = done.stdout[done.stdout.find("From <code>make report</code>") :]
        assert described and "<table" in described, visible_text(done.stdout)[:3000]
        assert "h100/llama-7b/bf16/zero3-1x4-mb1-ga1-ac" in visible_text(described)


def test_the_first_screen_holds_the_decision_and_no_empty_plot(
    chromium: str, report: tuple[str, str, Path], tmp_path: Path
) -> None:
    """At 1400x900 the decision (winner, runner-up, margin and interval, or the tie) ends above
    the fold; every plot that is drawn decoded (an empty one is a line saying why instead)."""
    done = browse(chromium, tmp_path / "p1", "--window-size=1400,900", "--dump-dom", report[2].as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    attrs = body_attrs(done.stdout)
    assert attrs.get("data-images-ok") == "true", attrs
    assert 0 < int(attrs["data-decision-bottom"]) <= 900, attrs
    first = done.stdout[
        done.stdout.index("<h2>Decision</h2>") : done.stdout.index(
            "<h2>", done.stdout.index("<h2>Decision</h2>") + 5
        )
    ]
    assert "wins on" in first and "95% interval" in first and "This qualification used" in first
    assert "No plot:" not in first
