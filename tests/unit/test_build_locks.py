"""A DeepSpeed op build lock that a killed job left (torch's FileBaton: `<op>/lock`, created
while ninja checks the build on every load) no longer makes every later job wait for ever:
the job removes it when no process holds it and it is old enough, and waits out a live one.
The locks here are torch's own FileBaton, taken by a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.job.startup import clear_stale_build_locks

HOLD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("file_baton", sys.argv[3])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)  # torch's own file, without importing torch (fast)
baton = module.FileBaton(sys.argv[1])
assert baton.try_acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
baton.release()
"""


def _baton_file() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    return str(Path(spec.origin).parent / "utils" / "file_baton.py")


def _holder(lock: Path, seconds: float) -> subprocess.Popen:
    cmd = [sys.executable, "-c", HOLD, str(lock), str(seconds), _baton_file()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_lock_left_by_a_killed_job_is_removed_and_torch_goes_on(tmp_path: Path) -> None:
    from torch.utils.file_baton import FileBaton

    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    holder = _holder(lock, 600)
    os.kill(holder.pid, signal.SIGKILL)  # `qualify cancel` while the job checked its build
    holder.wait()
    assert lock.exists()  # what every later job's FileBaton.wait() spun on
    removed = clear_stale_build_locks(tmp_path, poll_s=0.05, stale_s=0.2)
    assert len(removed) == 1 and str(lock) in removed[0] and "held by no process" in removed[0]
    started = time.monotonic()
    FileBaton(str(lock)).wait()  # returns at once now
    assert time.monotonic() - started < 1


def test_a_live_build_is_waited_for_not_broken(tmp_path: Path) -> None:
    lock = tmp_path / "cpu_adam" / "lock"
    lock.parent.mkdir()
    holder = _holder(lock, 0.6)
    os.utime(lock, (time.time() - 100, time.time() - 100))  # old, but held: a long build
    started = time.monotonic()
    assert clear_stale_build_locks(tmp_path, poll_s=0.05, stale_s=0.2) == []  # released by its holder
    assert time.monotonic() - started >= 0.3
    holder.wait(timeout=30)


def test_a_lock_held_past_the_abandoned_age_is_removed(tmp_path: Path) -> None:
    """On a shared cache the holder may be on another node, unseen: past the abandoned age the
    lock goes whoever holds it."""
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    holder = _holder(lock, 60)
    try:
        os.utime(lock, (time.time() - 700, time.time() - 700))
        (removed,) = clear_stale_build_locks(tmp_path, poll_s=0.05)
        assert "abandoned" in removed and not lock.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_in_torchs_default_layout_is_found(tmp_path: Path) -> None:
    """Without TORCH_EXTENSIONS_DIR torch builds under <root>/py<version>_<cpu|cu...>/<op>: the
    stale lock the adaptive Slurm test hung on was there."""
    from torch.utils.cpp_extension import _get_build_directory

    lock = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (time.time() - 100, time.time() - 100))
    assert len(clear_stale_build_locks(tmp_path, poll_s=0.05)) == 1 and not lock.exists()
    # that layout is torch's own: its build folder is named so under the default root
    assert Path(_get_build_directory("deepspeed_shm_comm", False)).parent.name.startswith("py")


def test_no_lock_costs_nothing(tmp_path: Path) -> None:
    (tmp_path / "op").mkdir()
    assert clear_stale_build_locks(tmp_path) == []
