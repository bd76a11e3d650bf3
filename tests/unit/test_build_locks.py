"""A DeepSpeed op build lock that a killed process left (torch's FileBaton: `<op>/lock`,
created while ninja checks the build on every load) no longer makes a job wait for ever: the
job's watcher removes it when no process holds it and it is old enough, at any time of the
job's life, and leaves a live one to its holder. The locks here are torch's own FileBaton,
taken by a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.job.startup import BuildLockWatch, remove_stale_build_locks

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
    assert remove_stale_build_locks(tmp_path, stale_s=600) == []  # too young yet: maybe a slow start
    os.utime(lock, (time.time() - 1, time.time() - 1))
    removed = remove_stale_build_locks(tmp_path, stale_s=0.5)
    assert len(removed) == 1 and str(lock) in removed[0] and "held by no process" in removed[0]
    started = time.monotonic()
    FileBaton(str(lock)).wait()  # returns at once now
    assert time.monotonic() - started < 1


def test_a_live_build_is_left_to_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "cpu_adam" / "lock"
    lock.parent.mkdir()
    holder = _holder(lock, 60)
    try:
        os.utime(lock, (time.time() - 100, time.time() - 100))  # old, but held: a long build
        assert remove_stale_build_locks(tmp_path, stale_s=0.2) == [] and lock.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_held_past_the_abandoned_age_is_removed(tmp_path: Path) -> None:
    """On a shared cache the holder may be on another node, unseen: past the abandoned age the
    lock goes whoever holds it."""
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    holder = _holder(lock, 60)
    try:
        os.utime(lock, (time.time() - 700, time.time() - 700))
        (removed,) = remove_stale_build_locks(tmp_path)
        assert "abandoned" in removed and not lock.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_in_torchs_default_layout_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TORCH_EXTENSIONS_DIR torch builds under <root>/py<version>_<cpu|cu...>/<op>: the
    stale lock the adaptive Slurm test hung on was there."""
    from torch.utils.cpp_extension import _get_build_directory

    monkeypatch.delenv(
        "TORCH_EXTENSIONS_DIR", raising=False
    )  # torch's default layout, whatever the shell says

    lock = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (time.time() - 100, time.time() - 100))
    assert len(remove_stale_build_locks(tmp_path)) == 1 and not lock.exists()
    # that layout is torch's own: its build folder is named so under the default root
    assert Path(_get_build_directory("deepspeed_shm_comm", False)).parent.name.startswith("py")


def test_no_lock_costs_nothing(tmp_path: Path) -> None:
    (tmp_path / "op").mkdir()
    assert remove_stale_build_locks(tmp_path) == []


def test_a_lock_left_after_the_job_started_no_longer_holds_its_loader(tmp_path: Path) -> None:
    """The race a check at start-up missed (a job of the adaptive Slurm test spun in its op
    loader until its time limit): the job starts its watcher, then another process takes the
    lock and is killed while this job's loader waits on it in torch's own FileBaton.wait();
    the watcher removes the lock once it is stale and the loader goes on."""
    from torch.utils.file_baton import FileBaton

    lock = tmp_path / "cpu_adam" / "lock"
    lock.parent.mkdir()
    said: list[str] = []
    watch = BuildLockWatch(tmp_path, said.append, poll_s=0.05, stale_s=0.5).start()
    try:
        holder = _holder(lock, 600)
        waited = threading.Event()
        loader = threading.Thread(
            target=lambda: (FileBaton(str(lock), wait_seconds=0.05).wait(), waited.set())
        )
        loader.start()
        time.sleep(0.8)  # older than stale_s, but held: the live build is waited for
        assert lock.exists() and not waited.is_set() and said == []
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert waited.wait(timeout=10), "the loader still waits on the killed process's lock"
        loader.join()
        assert len(said) == 1 and str(lock) in said[0] and "held by no process" in said[0]
    finally:
        watch.stop()
