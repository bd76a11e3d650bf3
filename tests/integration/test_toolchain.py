"""`.venv/bin/qualify sweep` run directly, from a shell whose PATH lacks the venv, compiles
nothing: the job puts its interpreter's `bin` first (pipeline.job.startup.use_interpreter_toolchain),
so the venv's ninja finds DeepSpeed's ops as scripts/prebuild_ops.py built them at install. Seen
before the fix: the system's ninja took the cache for stale and a point's job ran `cc1plus` on
DeepSpeed's shared-memory op for a minute, inside the measured start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.cpp_extension import get_default_build_root

from pipeline.sched.warm import SHARED_ENV
from tests.support.helpers import REPO


def _ops_cache() -> dict[str, tuple[int, int]]:
    """Every file of torch's extension cache: (size, modification time) by path."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


@pytest.mark.slow
def test_a_sweep_started_without_the_venv_on_path_builds_no_op(tmp_path: Path, sqlite_uri: str) -> None:
    before = _ops_cache()
    assert any(k.endswith("deepspeed_shm_comm.so") for k in before), (
        "the install builds DeepSpeed's shared-memory op (scripts/prebuild_ops.py); found none: "
        + repr(sorted(before))
    )
    venv_bin = Path(sys.executable).parent
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != venv_bin)
    res = subprocess.run(
        [
            str(venv_bin / "qualify"),
            "sweep",
            "--sweep",
            "smoke",
            "--launcher",
            "local",
            f"runs_dir={tmp_path / 'runs'}",
            f"tracking.uri={sqlite_uri}",
        ],
        cwd=REPO,
        # as a user's shell has it: no venv on PATH, and no warm server but the sweep's own
        env={**{k: v for k, v in os.environ.items() if k != SHARED_ENV}, "PATH": path},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert " accepted " in res.stdout, res.stdout[-2000:]
    after = _ops_cache()
    changed = sorted(k for k in after.keys() | before.keys() if after.get(k) != before.get(k))
    assert not changed, (
        f"the job rebuilt DeepSpeed's ops (files changed in torch's extension cache): {changed}"
    )
