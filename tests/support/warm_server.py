"""One warm server per test process (each xdist worker, and the Slurm stream), shared by every
local sweep of the integration tests through SQ_WARM_SERVER (pipeline.sched.warm.shared_server):
each sweep forks its ranks from it instead of starting its own server, which imports torch,
transformers and DeepSpeed again (about 6.5 core-seconds a sweep, some 60 sweeps in `make
test`). A test of the per-sweep server as a user meets it removes the variable
(`monkeypatch.delenv(SHARED_ENV)`): tests/integration/test_sweep_local.py's default sweep."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.sched.warm import PRELOAD, SHARED_ENV, start_server, stop_server

READY_S = 180  # the imports: 6-8 s idle, a minute or more under the suite's load


@pytest.fixture(scope="session")
def shared_warm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path | None]:
    if os.environ.get(SHARED_ENV):  # the caller's own server
        yield None
        return
    home = Path(tempfile.mkdtemp(prefix="sq-warm-test-"))  # 0700, and short: a socket's path is <= 107 bytes
    path = home / "s"
    log_path = tmp_path_factory.getbasetemp() / "warm-server.log"
    with open(log_path, "ab") as log:  # the server holds its own copy of the descriptor
        proc = start_server(path, PRELOAD, log, extra=("--idle-s", "86400"))
    deadline = time.monotonic() + READY_S
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if path.exists():
        os.environ[SHARED_ENV] = str(path)
    else:  # the sweeps start their own servers, as without this fixture
        print(f"shared warm server not serving: {log_path.read_text()[-2000:]}", file=sys.stderr)
    try:
        yield path if path.exists() else None
    finally:
        os.environ.pop(SHARED_ENV, None)
        stop_server(proc)
        shutil.rmtree(home, ignore_errors=True)
