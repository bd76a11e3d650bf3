"""No half-written checkpoint is ever taken for good: a truncated file falls back to the
previous checkpoint, a save into a full disk fails cleanly, a save killed half-way leaves the
previous one loadable. Real DeepSpeed (one gloo rank) in subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.train.checkpoint import MANIFEST, check_manifest, tag_for
from tests.support.helpers import PY, launch_ranks, warm_argv

pytestmark = pytest.mark.slow
WORKER = str(Path(__file__).resolve().parents[1] / "support" / "ckpt_worker.py")
WARM_WORKER = [PY, "-m", "tests.support.ckpt_worker"]  # forked by the warm server where one serves


def worker(*args: str, timeout: float = 300) -> tuple[int, dict]:
    out = subprocess.run(warm_argv([*WARM_WORKER, *args]), capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, out.stdout[-3000:] + out.stderr[-3000:]
    return out.returncode, json.loads(lines[-1])


def test_truncated_file_falls_back_to_previous(tmp_path: Path) -> None:
    rc, _ = worker(str(tmp_path), "train", "3", "--interval", "1")
    assert rc == 0
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text() == tag_for(2)
    victim = next(p for p in (ckpts / tag_for(2)).iterdir() if "optim_states" in p.name)
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    assert "bytes, the manifest says" in (check_manifest(ckpts / tag_for(2)) or "")
    rc, loaded = worker(str(tmp_path), "load")
    assert rc == 0
    assert loaded["loaded"] == 1 and loaded["fallbacks"] == 1


def test_full_disk_fails_cleanly_and_previous_still_loads(tmp_path: Path) -> None:
    rc, first = worker(str(tmp_path), "train", "2", "--interval", "1")
    assert rc == 0
    before = worker(str(tmp_path), "load")[1]
    assert before["loaded"] == 1
    # resume, then every later save hits a 600 kB file-size limit (the optimizer file is ~1.4 MB)
    rc, failed = worker(str(tmp_path), "train", "4", "--interval", "1", "--fsize-limit", str(600_000))
    assert rc == 17, failed
    assert "nothing was committed, the latest good checkpoint is still step00000001" in failed["save_failed"]
    assert "File too large" in failed["save_failed"], "the real cause, not O_DIRECT's EINVAL"
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "latest").read_text() == tag_for(1)
    assert not (ckpts / ".staging" / tag_for(2)).exists(), "the half-written save was cleaned up"
    after = worker(str(tmp_path), "load")[1]
    assert after["loaded"] == 1 and after["fallbacks"] == 0
    assert after["fingerprint"] == before["fingerprint"], "the previous checkpoint is intact"


def test_save_killed_half_way_leaves_previous_loadable(tmp_path: Path) -> None:
    # a wider model makes each save take long enough to be caught in the middle of it
    proc = subprocess.Popen(
        [PY, WORKER, str(tmp_path), "train", "50", "--interval", "1", "--hidden", "384"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    staging = tmp_path / "checkpoints" / ".staging"
    deadline = time.time() + 240
    killed_in = None
    while time.time() < deadline and proc.poll() is None:
        committed = [p.name for p in (tmp_path / "checkpoints").glob("step*")]
        in_flight = [p for p in staging.glob("step*")] if staging.exists() else []
        if committed and in_flight:
            killed_in = in_flight[0].name
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    proc.wait(timeout=60)
    assert killed_in is not None, "never caught a save in progress"
    ckpts = tmp_path / "checkpoints"
    latest = (ckpts / "latest").read_text()
    assert latest != killed_in and (ckpts / latest / MANIFEST).exists()
    rc, loaded = worker(str(tmp_path), "load", "--hidden", "384")
    assert rc == 0
    assert tag_for(loaded["loaded"]) == latest, (loaded, latest, killed_in)
    # the next start cleared what the killed save left behind
    assert not (ckpts / ".staging").exists() and not (ckpts / ".trash").exists()


@pytest.mark.parametrize("io", ["direct", "buffered", "deepspeed"])
def test_keep_last_and_every_manifest_checks_out(tmp_path: Path, io: str) -> None:
    """Each way of writing (the pipeline's writer with and without O_DIRECT, and DeepSpeed's
    own with the files read back) commits checkpoints whose manifest matches every byte on
    disk; only the last K stay, and nothing pruned or staged is left once the run is over."""
    rc, trained = worker(str(tmp_path), "train", "6", "--interval", "1", "--keep-last", "2", "--io", io)
    assert rc == 0, trained
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step*")) == [tag_for(4), tag_for(5)]
    for tag in (4, 5):
        manifest = json.loads((ckpts / tag_for(tag) / MANIFEST).read_text())
        on_disk = {p.name for p in (ckpts / tag_for(tag)).iterdir()} - {MANIFEST}
        assert set(manifest["files"]) == on_disk and len(on_disk) >= 2
        assert check_manifest(ckpts / tag_for(tag)) is None  # sizes and CRC-32s, read back
    assert not (ckpts / ".trash").exists()
    assert not any((ckpts / ".staging").iterdir())
    assert (ckpts / "zero_to_fp32.py").is_file()  # DeepSpeed's converter, next to `latest`
    rc, loaded = worker(str(tmp_path), "load", "--io", io)
    assert rc == 0 and loaded["loaded"] == 5 and loaded["fallbacks"] == 0


def test_a_save_failing_on_one_rank_fails_on_every_rank(tmp_path: Path) -> None:
    """Two ranks; only rank 1 hits a full disk. Neither hangs: both report the failed save, and
    the previous checkpoint stays the latest and loads on both."""
    run = [*WARM_WORKER, str(tmp_path)]
    assert all(r.returncode == 0 for r in launch_ranks(None, command=[*run, "train", "2", "--interval", "1"]))
    failing = [*run, "train", "4", "--interval", "1", "--fsize-limit", "300000", "--fsize-limit-rank", "1"]
    results = launch_ranks(None, command=failing, timeout=300)
    reports = [json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1]) for r in results]
    assert [r.returncode for r in results] == [17, 17], [r.stdout[-2000:] for r in results]
    assert "failed (on another rank: " in reports[0]["save_failed"]
    assert "File too large" in reports[1]["save_failed"]
    assert "File too large" in reports[0]["save_failed"], "the cause reaches every rank (issue 47)"
    for report in reports:
        assert "the latest good checkpoint is still step00000001" in report["save_failed"]
    assert (tmp_path / "checkpoints" / "latest").read_text() == tag_for(1)
    loads = launch_ranks(None, command=[*run, "load"])
    assert all(r.returncode == 0 for r in loads)
    assert [json.loads(r.stdout.splitlines()[-1])["loaded"] for r in loads] == [1, 1]
