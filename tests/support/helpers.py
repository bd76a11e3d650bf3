"""Shared test helpers: compose real configs, launch real ranks, read MLflow back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.config.compose import Composer, compose_point, hydra_context
from pipeline.config.schema import Config
from pipeline.contract.spec import JobSpec
from pipeline.home import source_checkout
from pipeline.job.distributed import free_port, rank_vars

PY = sys.executable
REPO = source_checkout() or Path.cwd()
HAVE_POSTGRES = (
    bool(list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))) or shutil.which("initdb") is not None
)
NEEDS_POSTGRES = pytest.mark.skipif(
    not HAVE_POSTGRES and os.environ.get("CI") != "true",
    reason="no PostgreSQL server here (bash cluster/postgres.sh install)",
)
"""A test of the PostgreSQL-backed tracking server: skipped without PostgreSQL, except in CI."""


@dataclass(frozen=True)
class SharedServer:
    url: str  # the MLflow server, with basic auth
    store_uri: str  # its PostgreSQL store, to read back directly (libpq finds the password in pgpass)
    pgpass: str  # the store's password file (PGPASSFILE)
    password: str  # the basic-auth password the clients send (MLFLOW_TRACKING_PASSWORD)


@contextmanager
def shared_server(work: Path, setenv: Any) -> Iterator[SharedServer]:
    """The project's PostgreSQL and `scripts/mlflow_server.sh` on it with basic auth, as a team
    shares one: the credentials go in the environment (`setenv`, pytest's monkeypatch.setenv),
    where the CLI reads them and sbatch hands them to the jobs."""
    from tests.support.tracking_server import mlflow_server, postgres

    work.chmod(0o711)  # the server runs as the postgres user
    password = "s3cret-pw-" + os.urandom(6).hex()
    setenv("MLFLOW_TRACKING_USERNAME", "sqadmin")
    setenv("MLFLOW_TRACKING_PASSWORD", password)
    with postgres(work) as env, mlflow_server(work, "postgres", env, auth=True) as url:
        pg = [
            subprocess.run(
                ["bash", "cluster/postgres.sh", cmd],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            for cmd in ("uri", "env")
        ]
        yield SharedServer(url, pg[0], pg[1].removeprefix("export PGPASSFILE="), password)


def compose(overrides: Sequence[str] = ()) -> Config:
    with hydra_context():
        return compose_point(0, list(overrides), Composer()).cfg


def write_spec(tmp: Path, point_dir: Path, overrides: Sequence[str], uri: str, point_id: str = "p") -> Path:
    """A job spec for `python -m pipeline.job.entry`, as the sweep would hand it to a job."""
    with hydra_context():
        point = compose_point(0, list(overrides), Composer())
    spec = JobSpec(
        sweep_id="test",
        point_id=point_id,
        config_yaml=point.yaml,
        point_dir=str(point_dir),
        parent_run_id=None,
        tracking_uri=uri,
        launcher="local",
        overrides=list(overrides),
    )
    path = tmp / f"spec-{point_id}-{len(list(tmp.glob('spec-*')))}.json"
    path.write_text(json.dumps(asdict(spec)))
    return path


def warm_argv(argv: Sequence[str]) -> list[str]:
    """`python -m module args...` as the client of the test process's warm server, which forks
    the module's process (pipeline.sched.warm: its environment, working directory, streams,
    signals and exit code are the client's); unchanged without a server or for any other
    command line. Not for a process a test kills with SIGKILL: that reaches only the client."""
    from pipeline.sched.warm import SHARED_ENV, SHARED_WAIT_S

    shared = os.environ.get(SHARED_ENV)
    if not shared or list(argv[:2]) != [PY, "-m"]:
        return list(argv)
    return [
        PY,
        "-m",
        "pipeline.sched.warm",
        "--socket",
        shared,
        "--wait-s",
        str(SHARED_WAIT_S),
        "run",
        *argv[1:],
    ]


def launch_ranks(
    spec: Path | None,
    world: int = 2,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
    warm: bool = True,
) -> list[subprocess.CompletedProcess[str]]:
    """Start `world` real processes, one per rank, the way srun would, and wait for all.
    Each runs `command` + [spec] (default: the pipeline's job entry, `python -m pipeline.job.entry`);
    `command` alone when spec is None.

    A `python -m module` rank is forked by the test process's warm server where one serves
    (tests/support/warm_server.py: SQ_WARM_SERVER), as the local launcher's ranks are: a process
    of its own, its environment, streams and exit code the client's, without paying torch's,
    transformers' and DeepSpeed's imports again (5-7 core-seconds a rank, the largest part of
    these tests' CPU). `warm=False`, or no server, starts each rank cold, as srun does."""
    argv = [*(command or [PY, "-m", "pipeline.job.entry"]), *([str(spec)] if spec else [])]
    argv = warm_argv(argv) if warm else argv
    port = free_port()
    procs = []
    for rank in range(world):
        e = {**os.environ, **(env or {}), **rank_vars(rank, world, rank, "127.0.0.1", port)}
        procs.append(
            subprocess.Popen(
                argv,
                cwd=REPO,
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    return out


def qualify(
    args: Sequence[str], timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real CLI, as a user runs it."""
    return subprocess.run(
        [PY, "-m", "pipeline.cli", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def point_runs(uri: str, experiment: str = "slurm-qualify") -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment} in {uri}"
    return list(client.search_runs([exp.experiment_id], "tags.`sq.kind` = 'point'", max_results=1000))


def wait_for(cond: Any, timeout: float, what: str, every: float = 0.3) -> Any:
    """Poll `cond` until it returns something truthy; fail naming `what` after `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def loss_history(uri: str, run_id: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(tracking_uri=uri).get_metric_history(run_id, "train/loss")
    return {m.step: m.value for m in hist}


def compose_point_yaml(overrides: Sequence[str] = ()) -> tuple[Config, str]:
    """One point's typed config and the config.yaml the sweep writes for it."""
    with hydra_context():
        point = compose_point(0, list(overrides), Composer())
    return point.cfg, point.yaml


def summary_row(stdout: str, point_id: str) -> str:
    """The summary table's row of a point: its line that starts with the point's index
    (`p0003-`), the one part of the id a row never elides; "" when there is none."""
    index = point_id.split("-", 1)[0] + "-"
    rows = [line for line in stdout.splitlines() if line.startswith(index)]
    return rows[-1] if rows else ""


def with_default_sigint(cmd: Sequence[str]) -> list[str]:
    """`cmd` run with SIGINT at its default action, as a terminal's foreground job has it,
    whatever this process inherited: a suite started in the background by a non-interactive
    shell (`nohup make test &`, a CI step run with `&`) has SIGINT ignored, an ignored signal
    stays ignored through exec, and Python then installs no KeyboardInterrupt handler at all.
    A tiny exec wrapper rather than preexec_fn, which is unsafe once threads run."""
    reset = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", reset, *cmd]


@dataclass(frozen=True)
class Fp16Ending:
    """How a tiny fp16 point ends on this machine's CPU: refused at once where DeepSpeed's CPU
    accelerator has no fp16 kernels, trained to the end where it does (oneDNN's fp16 on CPUs with
    AVX512-FP16 or AMX-FP16: a Sapphire Rapids Xeon runs fp16 training, as DeepSpeed says)."""

    outcome: str
    reason: str
    status: str  # the MLflow run's status


def fp16_ending() -> Fp16Ending:
    """Read once per test process from DeepSpeed itself (its CPU accelerator's is_fp16_supported),
    the reference the job's precision check uses, in a fresh interpreter."""
    global _FP16
    if _FP16 is None:
        code = (
            "from deepspeed.accelerator import get_accelerator as g; print('fp16', g().is_fp16_supported())"
        )
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300, check=True)
        runs = [line for line in out.stdout.splitlines() if line.startswith("fp16 ")] == ["fp16 True"]
        _FP16 = (
            Fp16Ending("accepted", "", "FINISHED")
            if runs
            else Fp16Ending("failed", "unsupported_precision", "FAILED")
        )
    return _FP16


_FP16: Fp16Ending | None = None
