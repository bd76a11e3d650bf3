"""A rank's start-up imports (docs/design.md, "Start-up"), each in a fresh process as a rank
starts: the job's modules never bring in the login node's packages (MLflow's server, plotting,
the report), and a rank that does not log never imports MLflow on its way to its first step
(DeepSpeed's autotuner would: 1.5 s here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.startup import login_only

# what a rank imports before its first step: the job's entry, the attempt's runner and the
# trainer (their module-level imports); on the rank that logs, its tracker on a SQLite store
# (it creates the run at once); then DeepSpeed as the runner imports it
RANK_IMPORTS = """
import json, sys
from pathlib import Path
import pipeline.job.entry, pipeline.job.runner, pipeline.train.trainer, pipeline.train.model
from pipeline.job.startup import import_deepspeed
from pipeline.tracking.ledger import Tracker
if {logs}:
    tmp = Path(sys.argv[1])
    Tracker(f"sqlite:///{{tmp}}/m.db", "e", tmp / "ledger", run_name="r", background=False).close()
import_deepspeed(logs={logs})
loaded = sorted(sys.modules)
import mlflow  # the end of a job (closing the sweep's parent run) may still import it
print(json.dumps(loaded))
"""


def rank_modules(logs: bool, tmp: Path) -> set[str]:
    code = RANK_IMPORTS.format(logs=logs)
    out = subprocess.run([sys.executable, "-c", code, str(tmp)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_a_rank_that_does_not_log_imports_neither_mlflow_nor_the_login_nodes_packages(tmp_path: Path) -> None:
    modules = rank_modules(False, tmp_path)
    assert "deepspeed" in modules and "torch" in modules, "the check ran on a rank's real imports"
    assert "deepspeed.autotuning.autotuner" in modules, "DeepSpeed still imports its autotuner"
    assert not [m for m in modules if m == "mlflow" or m.startswith("mlflow.")]
    assert login_only(modules) == []


def test_the_rank_that_logs_imports_no_login_node_package_either(tmp_path: Path) -> None:
    modules = rank_modules(True, tmp_path)
    assert "mlflow.store.tracking.sqlalchemy_store" in modules, "its tracker reached the store"
    assert login_only(modules) == []
