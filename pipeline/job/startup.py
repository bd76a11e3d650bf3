"""What a rank imports before its first step, and what it must not (docs/design.md, "Start-up").

A rank's start-up is paid on every attempt of every point, on every node. Measured with
`python -X importtime -m pipeline.job.entry` on a 2-rank run of the tiny model here: torch
(2-6 s of the rank's imports), DeepSpeed (about 1.8 s, of which 1.5 s is MLflow: DeepSpeed's
config imports its autotuner, which imports MLflow on every rank, for a launcher mode this
project never uses), and on the rank that logs, MLflow's SQL store (about 2 s with its alembic
migrations). The login node's own packages (MLflow's server, the report's plotting, analysis/)
have no place in a job at all; `tests/test_startup.py` fails if an import brings them back.
"""

from __future__ import annotations

import sys
from types import ModuleType

# Packages only the login node needs: the tracking server, the report and its plots.
LOGIN_NODE_ONLY = ("mlflow.server", "matplotlib", "plotly", "analysis")


def import_deepspeed(logs: bool) -> ModuleType:
    """DeepSpeed, imported without MLflow on a rank that does not log (`logs` False): its
    autotuner (`deepspeed.autotuning.autotuner`, imported by DeepSpeed's config) runs
    `import mlflow` inside `try/except Exception` and only uses it when the `deepspeed`
    launcher autotunes, which this project never does. A rank that logs has MLflow already
    (its tracker), and its tracker's thread may import from it at any time: nothing is hidden
    there."""
    if logs or "deepspeed" in sys.modules or "mlflow" in sys.modules:
        import deepspeed

        return deepspeed
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError
    try:
        import deepspeed
    finally:
        if sys.modules.get("mlflow", 0) is None:
            del sys.modules["mlflow"]  # a later `import mlflow` (the end of the job) works again
    return deepspeed
