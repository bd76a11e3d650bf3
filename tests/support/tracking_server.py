"""A real tracking server for tests and benchmarks (test_tracking_server, helpers.shared_server,
benchmarks/bench_tracking_server.py): the project's PostgreSQL (cluster/postgres.sh) and
scripts/mlflow_server.sh on a free loopback port, and writer processes logging through the
project's own tracking path, with what reached the server counted back."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KEYS = ("train/loss", "perf/step_s", "mem/rss_gib")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(
    url: str,
    timeout_s: float = 600.0,
    auth_ok: bool = False,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
) -> None:
    """Wait for the server's /health; fail at once, with its log, when its process has exited."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise RuntimeError(
                f"the MLflow server at {url} exited ({proc.returncode}) before answering:\n{tail}"
            )
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except urllib.error.HTTPError as e:  # the auth app answers 401 before login: it is up
            if auth_ok and e.code == 401:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no MLflow server at {url} after {timeout_s:.0f} s")


@contextmanager
def postgres(work: Path) -> Iterator[dict[str, str]]:
    """The project's PostgreSQL in `work`, on a free port; yields the environment for it."""
    # its own folder right under the system temp dir: the server runs as the postgres user,
    # which cannot pass through private parents (pytest's tmp_path has them)
    pg = Path(tempfile.mkdtemp(prefix="sq-pg-"))
    pg.chmod(0o711)
    env = {**os.environ, "SQ_PG_DIR": str(pg / "pg"), "SQ_PG_PORT": str(free_port())}
    up = subprocess.run(
        ["bash", "cluster/postgres.sh", "up"], cwd=REPO, env=env, capture_output=True, text=True, timeout=180
    )
    if up.returncode != 0:
        raise RuntimeError(f"cluster/postgres.sh up failed: {up.stderr[-2000:]}")
    try:
        yield env
    finally:
        subprocess.run(
            ["bash", "cluster/postgres.sh", "down"], cwd=REPO, env=env, capture_output=True, timeout=120
        )
        shutil.rmtree(pg, ignore_errors=True)


def server_processes(url: str) -> list[str]:
    """The command lines of the `mlflow server` listening at `url` and of all its descendants,
    read from /proc."""
    port = url.rsplit(":", 1)[1]
    procs: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        procs[int(d.name)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), cmd)
    roots = [pid for pid, (_, cmd) in procs.items() if " server " in cmd and f"--port {port}" in cmd]
    tree, frontier = set(roots), list(roots)
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, (ppid, _) in procs.items() if ppid == parent and pid not in tree]
        tree.update(kids)
        frontier += kids
    return [procs[pid][1] for pid in sorted(tree)]


@contextmanager
def mlflow_server(
    work: Path, backend: str, env: dict[str, str] | None = None, auth: bool = False, workers: int = 2
) -> Iterator[str]:
    """scripts/mlflow_server.sh on a free loopback port, `workers` request handlers; yields its URL."""
    port = free_port()
    env = {
        **(env or os.environ),
        "VENV": str(Path(sys.executable).parent.parent),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "WORKERS": str(workers),
        "BACKEND": backend,
        "ARTIFACTS": str(work / "artifacts"),
        "SQ_MLFLOW_STATE": str(work / "state"),
        "SQ_MLFLOW_AUTH": "1" if auth else "0",
    }
    log_path = work / f"server-{port}.log"
    log = open(log_path, "w")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        ["bash", "scripts/mlflow_server.sh"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, auth_ok=auth, proc=proc, log=log_path)
        yield url
    finally:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        except ProcessLookupError:  # already gone (it failed to start)
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


WRITER = """
import sys
from pathlib import Path
from pipeline.tracking.ledger import Tracker
uri, exp, folder, name, steps = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
t = Tracker(uri, exp, folder, run_name=name, flush_every_s=1.0)
for step in range(steps):
    t.log_metrics({"train/loss": 1.0 / (step + 1), "perf/step_s": 0.01 * step, "mem/rss_gib": 1.5}, step)
t.close()
print("RUN_ID", t.run_id, t.last_error or "")
"""


def run_writers(uri: str, work: Path, writers: int, steps: int, experiment: str) -> tuple[float, list[str]]:
    """Start `writers` processes at once; (wall seconds, their run ids)."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                uri,
                experiment,
                str(work / "ledgers" / f"w{i}"),
                f"writer-{i}",
                str(steps),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(writers)
    ]
    run_ids = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"a writer failed: {err[-2000:]}")
        line = next(ln for ln in out.splitlines() if ln.startswith("RUN_ID "))
        run_ids.append(line.split()[1])
    return time.perf_counter() - t0, run_ids


def stored(uri: str, run_ids: list[str]) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return sum(len(client.get_metric_history(r, k)) for r in run_ids for k in KEYS)
