"""sbatch/nccl_tests.sbatch's size knobs (a ZeRO stage's bucket sizes): refused with exit 2
unless they are byte counts, and never run as code."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "sbatch" / "nccl_tests.sbatch"


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SQ_", "SLURM_"))}
    base.update(SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="7", NCCL_TESTS_DIR=str(tmp_path / "none"))
    return subprocess.run(
        ["bash", str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("SQ_NCCL_MIN", "$(touch pwned)"),
        ("SQ_NCCL_MAX", "1G; touch pwned"),
        ("SQ_NCCL_MAX", "`touch pwned`"),
        ("SQ_NCCL_MIN", "-1"),
        ("SQ_NCCL_MIN", "1e9"),
        ("SQ_NCCL_MAX", "8 G"),
        ("SQ_NCCL_ITERS", "0"),
        ("SQ_NCCL_ITERS", "5 -c 0"),
    ],
)
def test_a_size_that_is_not_bytes_is_refused(tmp_path: Path, knob: str, value: str) -> None:
    r = run(tmp_path, **{knob: value})
    assert r.returncode == 2, r.stderr
    assert knob in r.stderr and "allowed:" in r.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "nccl-7").exists()


def test_bucket_sizes_pass_to_nccl_tests(tmp_path: Path) -> None:
    """ZeRO-3's default bf16 buckets (1e8 and 1e9 bytes) pass the check; the script then stops at
    the missing nccl-tests binaries (exit 2), before any srun."""
    r = run(tmp_path, SQ_NCCL_MIN="100000000", SQ_NCCL_MAX="1000000000", SQ_NCCL_ITERS="5")
    assert r.returncode == 2 and "all_reduce_perf: build nccl-tests" in r.stderr, r.stderr
