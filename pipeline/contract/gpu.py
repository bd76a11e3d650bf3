"""What the GPUs of this node are, from NVML (nvidia-ml-py's `pynvml`): the name, memory and
driver a run is attributed to, and whether they match what the partition promised.

Without a GPU (or without the NVIDIA driver) NVML cannot load; the job then says so in one
line and records the device as the CPU, instead of failing or guessing."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from types import ModuleType

NVML_MODULE_ENV = "SQ_NVML_MODULE"  # the test seam: a module with the pynvml API (tests/support/fake_nvml.py)


def nvml() -> ModuleType:
    """nvidia-ml-py's `pynvml`, or the module SQ_NVML_MODULE names (a fake with its interface,
    for tests on machines without a GPU). Raises ImportError when neither can be imported."""
    return importlib.import_module(os.environ.get(NVML_MODULE_ENV) or "pynvml")


def job_gpu_indices(count: int) -> list[int]:
    """The NVML indices of the GPUs this job was given: CUDA_VISIBLE_DEVICES when it lists
    indices (Slurm sets it from the job's GRES), else every GPU of the node."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return list(range(count))
    parts = [v.strip() for v in visible.split(",") if v.strip()]
    if all(v.isdigit() for v in parts):
        return [int(v) for v in parts if int(v) < count]
    return list(range(count))  # UUIDs or MIG names: NVML indices are not recoverable here


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_gib: float
    driver: str
    cuda_driver: str

    def matches(self, gpu_type: str) -> bool:
        """'h100' matches 'NVIDIA H100 80GB HBM3'; 'a100' matches 'NVIDIA A100-SXM4-80GB'."""
        words = self.name.lower().replace("-", " ").replace("_", " ").split()
        return gpu_type.lower() in words  # whole words: 'h20' must not match 'H200


def inventory() -> tuple[list[GpuInfo], str]:
    """(the node's GPUs, a note); the list is empty when NVML is not available here."""
    try:
        pynvml = nvml()
    except ImportError:
        return [], "nvidia-ml-py is not installed: no GPU inventory"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:  # NVMLError_LibraryNotFound on a machine without the driver
        return [], f"NVML unavailable ({type(e).__name__}): no NVIDIA driver on this node, CPU only"
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append(GpuInfo(i, _text(pynvml.nvmlDeviceGetName(h)), mem.total / 2**30, driver, cuda_text))
        return gpus, f"{len(gpus)} GPU(s), driver {driver}, CUDA {cuda_text}"
    finally:
        pynvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_partition(gpus: list[GpuInfo], gpu_type: str, local_rank: int) -> str | None:
    """A one-line warning when the GPU this rank uses is not the partition's type."""
    if not gpus or gpu_type == "cpu":
        return None
    gpu = gpus[local_rank % len(gpus)]
    if gpu.matches(gpu_type):
        return None
    return f"partition promises {gpu_type} GPUs but this rank runs on '{gpu.name}': figures are that GPU's"
