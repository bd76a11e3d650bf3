"""Fixtures shared by the test modules (a real SQLite MLflow store per test) and the one
definition of the two suites.

tests/unit/ holds the tests that run in one process on a CPU in seconds; tests/integration/ the
files with a test marked by one of INTEGRATION_MARKS (multi-process DeepSpeed jobs, Slurm, a GPU,
Chromium), alongside that file's cheaper checks (which still build models or start processes).
The folder decides: `--suite unit` selects tests/unit/ (`make test-fast` and the first phase of
scripts/test.sh), `--suite integration` tests/integration/. A marked test under tests/unit/ is a
usage error.

tests/ is a package (and so are tests/support and benchmarks/): pytest puts the checkout root,
the folder above the top package, first on sys.path, so every module imports
`tests.support.helpers` and `benchmarks.bench_overhead` by name, with no sys.path edit."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pipeline.job.startup import use_venv_ops_cache

pytest_plugins = ["tests.support.slurm_fixtures"]  # slurm_cluster, mlflow_server for every module

os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
# DeepSpeed's ops, for the engines tests build in-process too, from the venv's own cache, where
# the install built them (pipeline.job.startup.use_venv_ops_cache; every job sets it itself)
use_venv_ops_cache()

INTEGRATION_MARKS = ("slow", "slurm", "gpu", "browser")
UNIT_DIR = Path(__file__).resolve().parent / "unit"
INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--one-mlflow-server",
        action="store_true",
        help="one `mlflow server` for the session's tests instead of one per module (where every "
        "test that uses it logs to an experiment of its own: scripts/test.sh's Slurm stream)",
    )
    parser.addoption(
        "--suite",
        choices=("unit", "integration"),
        default=None,
        help="unit: tests/unit/; integration: tests/integration/ (every test marked "
        f"{', '.join(INTEGRATION_MARKS)} is there)",
    )


def _marked(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in INTEGRATION_MARKS)


def _integration(item: pytest.Item) -> bool:
    return INTEGRATION_DIR in Path(str(item.path)).parents or _marked(item)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --suite, the other suite's folder is not even imported: collecting tests/integration/
    (its modules import DeepSpeed, servers' clients, the benchmarks) cost each xdist worker of
    the unit suite about 5 s."""
    suite = config.getoption("--suite")
    other = {"unit": INTEGRATION_DIR, "integration": UNIT_DIR}.get(suite)
    if other is not None and (collection_path == other or other in collection_path.parents):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = [i.nodeid for i in items if _marked(i) and UNIT_DIR in Path(str(i.path)).parents]
    if misplaced:
        raise pytest.UsageError(
            f"tests/unit/ holds tests marked {'/'.join(INTEGRATION_MARKS)}: move them to "
            f"tests/integration/: {', '.join(misplaced)}"
        )
    suite = config.getoption("--suite")
    if suite is None:
        return
    keep = [i for i in items if _integration(i) == (suite == "integration")]
    dropped = [i for i in items if _integration(i) != (suite == "integration")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if suite == "integration":
        items[:] = longest_files_first(items)


def longest_files_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The files holding a test marked `long(seconds)` first, the longest first, each file's
    tests together and in their order; the rest as collected. scripts/test.sh's niced stream
    hands whole files to its two workers in this order (--dist loadfile --no-loadscope-reorder):
    a test of minutes that started last ran alone at the end (CI: the nine-family sweep, 266 s)."""
    longest: dict[Path, float] = {}
    for item in items:
        mark = item.get_closest_marker("long")
        seconds = float(mark.args[0]) if mark is not None and mark.args else 0.0
        longest[Path(str(item.path))] = max(longest.get(Path(str(item.path)), 0.0), seconds)
    order = {path: rank for rank, path in enumerate(sorted(longest, key=lambda p: -longest[p]))}
    return sorted(items, key=lambda i: order[Path(str(i.path))])


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store whose schema MLflow has made (its migrations take about a
    second per store): each test gets a copy of this file."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("store") / "empty.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments(max_results=1)
    return path


@pytest.fixture
def sqlite_uri(tmp_path: Path, migrated_store: Path) -> str:
    """A fresh MLflow SQLite store of the test's own (mlflow's own tests do the same)."""
    db = tmp_path / "mlruns.db"
    shutil.copyfile(migrated_store, db)
    return f"sqlite:///{db}"
