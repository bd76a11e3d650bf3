"""NVML inventory and the GPU-only measurements: real on a GPU machine, a clear degradation
on a CPU one (here)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.contract.gpu import GpuInfo, check_partition, inventory
from tests.support.helpers import launch_ranks, write_spec


def has_gpu() -> bool:
    return (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )


def test_gpu_name_matching() -> None:
    h100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", 79.6, "550.54", "12.4")
    assert h100.matches("h100") and not h100.matches("a100")
    assert GpuInfo(0, "NVIDIA A100-SXM4-80GB", 80, "", "").matches("a100")
    assert not GpuInfo(0, "NVIDIA H200", 141, "", "").matches("h20"), "whole words only"
    assert check_partition([h100], "h100", 0) is None
    assert "runs on 'NVIDIA H100 80GB HBM3'" in (check_partition([h100], "a100", 0) or "")


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU: the CPU degradation does not apply")
def test_without_a_gpu_nvml_degrades_with_a_clear_note() -> None:
    gpus, note = inventory()
    assert gpus == []
    assert "NVML unavailable" in note or "not installed" in note


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_run_reports_cuda_memory_and_datasheet_mfu(tmp_path: Path, sqlite_uri: str) -> None:
    """On one GPU: CUDA peak memory, NCCL, MFU and HFU against the partition's peak."""
    if not has_gpu():
        pytest.skip("no NVIDIA GPU here")
    gpus, _ = inventory()
    gpu_type = next((t for t in ("h200", "h100", "a100", "b200", "l40s") if gpus[0].matches(t)), None)
    if gpu_type is None:
        pytest.skip(f"no partition config for {gpus[0].name}")
    overrides = [
        f"partition={gpu_type}",
        "model=gpt2-125m",
        "precision=bf16",
        "parallelism=zero2",
        "parallelism.gpus_per_node=1",
        "parallelism.micro_batch=8",
        "train.steps=30",
        "train.warmup_steps=5",
    ]
    spec = write_spec(tmp_path, tmp_path / "gpu", overrides, sqlite_uri, "gpu")
    results = launch_ranks(spec, world=1, timeout=900)
    outcome = json.loads((tmp_path / "gpu" / "outcome.json").read_text())
    assert outcome["outcome"] == "accepted", results[0].stdout[-3000:]
    m = outcome["metrics"]
    assert m["mem/peak_allocated_gib"] > 0
    assert 0 < m["perf/mfu"] < 1 and m["perf/hfu"] >= m["perf/mfu"]
