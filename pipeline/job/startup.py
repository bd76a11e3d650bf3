"""What a rank imports before its first step, and what it must not (docs/design.md, "Start-up").

A rank's start-up is paid on every attempt of every point, on every node. Measured with
`python -X importtime -m pipeline.job.entry` on a 2-rank run of the tiny model here: torch
(2-6 s of the rank's imports), DeepSpeed (about 1.8 s, of which 1.5 s is MLflow: DeepSpeed's
config imports its autotuner, which imports MLflow on every rank, for a launcher mode this
project never uses), and on the rank that logs, MLflow's SQL store (about 2 s with its alembic
migrations). The login node's own packages (MLflow's server, the report's plotting, analysis/)
have no place in a job at all; `tests/integration/test_startup_imports.py` fails if an import
brings them back.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any

from pipeline.tracking.keys import TAG_STARTUP_NODE_PREFIX

# Packages only the login node needs: the tracking server, the report and its plots.
LOGIN_NODE_ONLY = ("mlflow.server", "matplotlib", "plotly", "analysis")


def use_interpreter_toolchain(
    env: MutableMapping[str, str] | None = None, executable: str | None = None
) -> bool:
    """Put this interpreter's own `bin` folder first on PATH, for this rank and every process it
    starts (the reshape drill's ranks, DeepSpeed's op loader). DeepSpeed's C++ ops are built at
    install with the venv's ninja (scripts/prebuild_ops.py); found first on PATH, another ninja
    (the system's) takes the cached build for stale and compiles the ops again inside the job's
    measured start-up, for minutes. A job started through `make` has the venv first already;
    `.venv/bin/qualify` run directly, an sbatch script or a user's own shell may not. The folder
    is the interpreter's as invoked (a venv's `bin/python` is a link: not resolved). True when
    PATH changed."""
    env = os.environ if env is None else env
    bin_dir = str(Path(executable or sys.executable).parent)
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    if parts[:1] == [bin_dir]:
        return False
    env["PATH"] = os.pathsep.join([bin_dir, *(p for p in parts if p != bin_dir)])
    return True


OPS_CACHE = "torch_extensions"
"""The folder of a venv where DeepSpeed's C++ ops are built and found (TORCH_EXTENSIONS_DIR)."""


def venv_ops_cache(executable: str | None = None) -> Path | None:
    """`<venv>/torch_extensions` of the venv this interpreter belongs to (its real path: two
    links to one venv share one cache), or None outside a venv. torch's default cache,
    `~/.cache/torch_extensions`, is shared by every checkout of a user: one venv's build there
    makes another venv's stale (another interpreter, another ninja), and its next job compiles
    DeepSpeed's ops again for minutes, or fails on the lock of a rebuild in progress."""
    venv = Path(executable or sys.executable).parent.parent
    if not (venv / "pyvenv.cfg").is_file():
        return None
    return venv.resolve() / OPS_CACHE


def use_venv_ops_cache(
    env: MutableMapping[str, str] | None = None, executable: str | None = None
) -> Path | None:
    """Point TORCH_EXTENSIONS_DIR at this interpreter's venv's own op cache, for this process and
    every process it starts (a job's ranks, the reshape drill's, the install's prebuild,
    scripts/prebuild_ops.py): the ops are kept with the venv that built them, so two checkouts on
    one machine never rebuild each other's. Returns the folder (None outside a venv: left as is)."""
    env = os.environ if env is None else env
    cache = venv_ops_cache(executable)
    if cache is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(cache)
    return cache


STALE_LOCK_S = 30.0
"""A build lock no process of this node holds open is left by a killed job after this long."""
ABANDONED_LOCK_S = 600.0
"""A build lock held by no process of this node (one of another node may, on a shared cache)
is abandoned after this long: ten times the longest op build measured here (66 s)."""


def extensions_root(env: Mapping[str, str] | None = None) -> Path:
    """torch's extension cache, where DeepSpeed's op loader builds and finds its ops."""
    from torch.utils.cpp_extension import get_default_build_root

    env = os.environ if env is None else env
    return Path(env.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def held_open(path: Path) -> bool:
    """A process of this node (that this user may look into) has `path` open: torch's FileBaton
    keeps its lock file open from creation to release."""
    target = str(path)
    for fds in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == target for fd in fds.iterdir()):
                return True
        except OSError:
            continue
    return False


def remove_stale_build_locks(
    root: Path, stale_s: float = STALE_LOCK_S, abandoned_s: float = ABANDONED_LOCK_S
) -> list[str]:
    """One pass over the op build locks in `root` (`<op>/lock`): remove those a killed process
    left, so that DeepSpeed's op loader does not wait for ever; a live build's lock stays (its
    waiters wait for it, as torch means them to).

    torch's JIT loader (cpp_extension's `_jit_compile`, which DeepSpeed's CPU ops go through on
    every load, built or not) creates `<op>/lock` while ninja checks the build, and its waiters
    spin until that file is gone. A process killed in that window (a sweep cancelled and resumed,
    measured here: every later job sat in "the process group" for 14 minutes) leaves the file
    for good. A lock is stale when no process of this node holds it open and it is
    STALE_LOCK_S old, or at any rate ABANDONED_LOCK_S old (a shared cache: a holder on another
    node is not seen). Returns what was removed, in words (the job log says it)."""
    removed = []
    # <root>/<op>/lock with TORCH_EXTENSIONS_DIR; <root>/py311_cpu/<op>/lock without it (torch
    # adds the interpreter's and CUDA's versions to its default root)
    for lock in sorted([*root.glob("*/lock"), *root.glob("*/*/lock")]):
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            continue  # released
        held = held_open(lock)
        if (not held and age >= stale_s) or age >= abandoned_s:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
            removed.append(
                f"{lock} ({age:.0f} s old, {'held by no process here' if not held else 'abandoned'})"
            )
    return removed


class BuildLockWatch:
    """A daemon thread that runs `remove_stale_build_locks` every `poll_s` for as long as the
    rank lives. A check made once, at the start, misses the lock a process killed a moment
    later leaves while this rank loads its ops (both ops load after the process group, and the
    other tests and jobs of a node start and die all the time): this rank's loader would then
    spin on it until the time limit. Each removal goes to `report` (the job log)."""

    def __init__(
        self,
        root: Path,
        report: Callable[[str], None],
        poll_s: float = 1.0,
        stale_s: float = STALE_LOCK_S,
        abandoned_s: float = ABANDONED_LOCK_S,
    ) -> None:
        self.root, self.report, self.poll_s = root, report, poll_s
        self.stale_s, self.abandoned_s = stale_s, abandoned_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sq-build-locks", daemon=True)

    def start(self) -> BuildLockWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.poll_s + 5)

    def _run(self) -> None:
        while True:
            try:
                for removed in remove_stale_build_locks(self.root, self.stale_s, self.abandoned_s):
                    self.report(removed)
            except OSError as e:  # an unreadable cache: the loader will say so itself
                self.report(f"{self.root}: {e}; build locks are not watched")
                return
            if self._stop.wait(self.poll_s):
                return


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


# the start-up phases logged per node: the first symptom of a slow shared file system is a
# slow `import torch` (ClusterMAX lists it under storage); the model build reads the weights
NODE_PHASES = ("import_s", "model_build_s")


def per_node(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{node: {phase: seconds}} from every rank's {"node", phase: seconds}: the slowest rank
    of each node, which the node's other ranks wait for at the first collective."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        node = out.setdefault(str(row["node"]), {})
        for phase in NODE_PHASES:
            if phase in row:
                node[phase] = max(node.get(phase, 0.0), float(row[phase]))
    return out


def node_startup(parts: dict[str, float], node: str) -> dict[str, dict[str, float]]:
    """Every node's import and model-build seconds, on every rank (one all_gather_object over
    the job's process group; called by every rank once the engine is built)."""
    import torch.distributed as dist

    mine = {"node": node, **{p: parts[p] for p in NODE_PHASES if p in parts}}
    if not dist.is_initialized():
        return per_node([mine])
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, mine)
    return per_node(rows)


def node_tags(nodes: dict[str, dict[str, float]]) -> dict[str, str]:
    """`sq.startup.<node>` = "import_s=1.234 model_build_s=0.056" for each node."""
    return {
        f"{TAG_STARTUP_NODE_PREFIX}{node}": " ".join(f"{k}={v:.3f}" for k, v in sorted(phases.items()))
        for node, phases in nodes.items()
    }
