"""A fake of nvidia-ml-py's `pynvml` for tests on machines without a GPU.

The same function names, argument orders and return types as nvidia-ml-py 12 (structs with the
same field names, mW for power, mJ for the energy counter, MHz, degrees C, bit masks for the
clock-event reasons); its constants and its NVMLError class are nvidia-ml-py's own, imported
from the real module (which loads no library until nvmlInit). Queries a GPU does not support
raise NVMLError(NVML_ERROR_NOT_SUPPORTED), as the library does.

The fake node is this process's node (SLURMD_NODENAME, else the host name). Knobs, read at
nvmlInit so a job started by Slurm picks them up from its environment:
- SQ_FAKE_NVML_GPUS: GPUs per node (default 8), SQ_FAKE_NVML_NAME: the product name.
- SQ_FAKE_NVML_ECC_NODES: comma-separated nodes whose GPU 0 has an uncorrected ECC error.
- SQ_FAKE_NVML_ECC_FILE: a file naming the node with the error; when it is empty or missing,
  the first node that reads it writes its own name there (the node a point lands on first is bad).
- SQ_FAKE_NVML_NO_ENERGY=1: the energy counter is not supported (pre-Volta GPUs).
- SQ_FAKE_NVML_PCIE_WIDTH: the current PCIe link width (max 16).

Power follows a fixed, documented pattern so tests can compute the expected energy: each GPU
draws 300 + 10*i W (H100 SXM's range is 70..700 W); the energy counter integrates it over
time.monotonic() from nvmlInit, starting from a per-GPU offset, exactly as the hardware counter
(mJ since the driver was loaded) does.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pynvml import (  # the real library's constants and error classes
    NVML_CLOCK_SM,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_FEATURE_DISABLED,
    NVML_FEATURE_ENABLED,
    NVML_MEMORY_ERROR_TYPE_CORRECTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_NVLINK_MAX_LINKS,
    NVML_TEMPERATURE_GPU,
    NVML_VOLATILE_ECC,
    NVMLError,
    nvmlClocksEventReasonGpuIdle,
    nvmlClocksEventReasonNone,
)

__all__ = [
    "NVML_CLOCK_SM",
    "NVML_FEATURE_DISABLED",
    "NVML_FEATURE_ENABLED",
    "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
    "NVML_NVLINK_MAX_LINKS",
    "NVML_TEMPERATURE_GPU",
    "NVML_VOLATILE_ECC",
    "NVMLError",
    "nvmlClocksEventReasonGpuIdle",
    "nvmlClocksEventReasonNone",
]

GIB = 2**30
NVLINKS = 18  # H100 SXM: 18 NVLink 4 links per GPU


class _State:
    def __init__(self) -> None:
        self.initialised = 0
        self.t0 = 0.0
        self.gpus = 8
        self.name = "NVIDIA H100 80GB HBM3"
        self.bad = False
        self.no_energy = False
        self.pcie_width = 16


_S = _State()


def node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _bad_node() -> bool:
    me = node()
    if me in [n for n in os.environ.get("SQ_FAKE_NVML_ECC_NODES", "").split(",") if n]:
        return True
    path = os.environ.get("SQ_FAKE_NVML_ECC_FILE")
    if not path:
        return False
    p = Path(path)
    try:
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # the first node to come claims it
        os.write(fd, me.encode())
        os.close(fd)
    except FileExistsError:
        pass
    for _ in range(50):  # the claimer may not have written yet
        text = p.read_text().strip()
        if text:
            return text == me
        time.sleep(0.01)
    return False


def nvmlInit() -> None:
    if not _S.initialised:
        _S.t0 = time.monotonic()
        _S.gpus = int(os.environ.get("SQ_FAKE_NVML_GPUS", "8"))
        _S.name = os.environ.get("SQ_FAKE_NVML_NAME", "NVIDIA H100 80GB HBM3")
        _S.bad = _bad_node()
        _S.no_energy = os.environ.get("SQ_FAKE_NVML_NO_ENERGY") == "1"
        _S.pcie_width = int(os.environ.get("SQ_FAKE_NVML_PCIE_WIDTH", "16"))
    _S.initialised += 1


def nvmlShutdown() -> None:
    _check()
    _S.initialised -= 1


def _check() -> None:
    if not _S.initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def nvmlSystemGetDriverVersion() -> str:
    _check()
    return "550.54.15"


def nvmlSystemGetCudaDriverVersion() -> int:
    _check()
    return 12040


def nvmlDeviceGetCount() -> int:
    _check()
    return _S.gpus


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _check()
    if not 0 <= index < _S.gpus:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetName(handle: _Handle) -> str:
    return _S.name


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> Any:
    total = 80 * GIB
    used = (2 + handle.index) * GIB
    return SimpleNamespace(total=total, free=total - used, used=used)


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> Any:
    return SimpleNamespace(gpu=90 - handle.index, memory=40)  # percent over the last sample period


def power_w(index: int) -> float:
    """The fake's constant draw of GPU `index`, W (tests compute the expected energy from it)."""
    return 300.0 + 10.0 * index


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    return int(power_w(handle.index) * 1000)  # mW


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    """mJ since the driver was loaded (a large offset), integrating power_w over time."""
    if _S.no_energy:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(5e9 + handle.index * 1e6 + power_w(handle.index) * 1000 * (time.monotonic() - _S.t0))


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return 55 + handle.index


def nvmlDeviceGetClockInfo(handle: _Handle, clock_type: int) -> int:
    if clock_type != NVML_CLOCK_SM:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return 1980  # MHz (H100 SXM boost)


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    return nvmlClocksEventReasonGpuIdle


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons  # the older name


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        return 1 if _S.bad and handle.index == 0 else 0
    return 0


def nvmlDeviceGetPcieReplayCounter(handle: _Handle) -> int:
    return 0


def nvmlDeviceGetRetiredPagesPendingStatus(handle: _Handle) -> int:
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # Hopper retires no pages: it remaps rows


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    return (0, 0, 0, 0)  # corrected rows, uncorrected rows, remapping pending, remapping failed


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    return _S.pcie_width


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    return 16


def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    return 5


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    return 5


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    if link >= NVLINKS:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return NVML_FEATURE_ENABLED
