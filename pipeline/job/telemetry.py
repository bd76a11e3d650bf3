"""What the hardware does while a run runs: a sampler thread per node (on each node's local
rank 0) that records, every `telemetry.interval_s`, per GPU of the job through NVML
(nvidia-ml-py): utilisation, memory used, power, temperature, SM clock, active clock-event
(throttle) reasons, uncorrected ECC errors and PCIe replays; and per host: CPU utilisation and
memory used (psutil). Energy comes from counters, never from integrating sampled power: the
GPU's `nvmlDeviceGetTotalEnergyConsumption` (mJ) and the host's RAPL package counters under
/sys/class/powercap (uJ), each as its last reading minus its first.

The samples stay in memory on their node; at the end of the attempt one collective brings them
to rank 0, which logs them (MLflow system-metric style keys, `sys/<node>/gpu<i>/power_w`, step
= the sample's Unix time in ms). A value a query cannot give (NVML's NOT_SUPPORTED, a RAPL file
that is not readable) is absent, never 0, and the reason is kept in `notes`."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from pipeline.contract.gpu import job_gpu_indices, nvml
from pipeline.tracking import keys as K

GIB = 2**30
POWERCAP = Path("/sys/class/powercap")


def node_name() -> str:
    """The Slurm node name (SLURMD_NODENAME), else the short host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def gpu_key(node: str, index: int, what: str) -> str:
    return f"{K.SYS_PREFIX}{node}/gpu{index}/{what}"


def host_key(node: str, what: str) -> str:
    return f"{K.SYS_PREFIX}{node}/{what}"


@dataclass
class NodeTelemetry:
    """One node's samples and energy totals over the sampled window."""

    node: str
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # (unix s, key -> value)
    gpu_energy_j: dict[int, float] = field(default_factory=dict)  # GPU index -> last - first counter
    host_energy_j: float | None = None  # RAPL packages, last - first (None: not readable)
    window_s: float = 0.0  # first to last energy reading
    notes: list[str] = field(default_factory=list)  # why something is absent


class Rapl:
    """The host's RAPL package counters (intel-rapl:<n>/energy_uj), wrap-around corrected."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.domains: list[tuple[Path, int]] = []
        self.note = ""
        zones = sorted(root.glob("intel-rapl:*")) if root.is_dir() else []
        packages = [z for z in zones if z.name.count(":") == 1]  # sub-domains are inside their package
        if not packages:
            self.note = f"host energy absent: no RAPL counter under {root}"
            return
        for z in packages:
            try:
                (z / "energy_uj").read_text()
                wrap = int((z / "max_energy_range_uj").read_text())
            except (OSError, ValueError) as e:
                self.note = f"host energy absent: {z / 'energy_uj'} is not readable ({type(e).__name__})"
                self.domains = []
                return
            self.domains.append((z / "energy_uj", wrap))

    def read(self) -> list[int] | None:
        if not self.domains:
            return None
        try:
            return [int(p.read_text()) for p, _ in self.domains]
        except (OSError, ValueError):
            return None

    def joules(self, first: list[int], last: list[int]) -> float:
        total = 0
        for (_, wrap), a, b in zip(self.domains, first, last, strict=True):
            total += b - a if b >= a else b + wrap - a  # one wrap at most between two readings
        return total / 1e6


class Sampler:
    """The sampler thread of one node. `start()`, then `stop()` returns the node's telemetry."""

    def __init__(self, interval_s: float, node: str | None = None, powercap: Path = POWERCAP) -> None:
        self.interval_s = interval_s
        self.tel = NodeTelemetry(node or node_name())
        self._rapl = Rapl(powercap)
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._unsupported: set[str] = set()  # queries NVML refused once: not asked again
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._energy_first: dict[int, int] = {}
        self._energy_last: dict[int, int] = {}
        self._rapl_first: list[int] | None = None
        self._rapl_last: list[int] | None = None
        self._t_first = self._t_last = 0.0

    def start(self) -> Sampler:
        self._open_nvml()
        if self._rapl.note:
            self.tel.notes.append(self._rapl.note)
        psutil.cpu_percent(None)  # the first call only sets psutil's reference point
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="sq-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> NodeTelemetry:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 10)
        self._sample()
        tel = self.tel
        tel.window_s = self._t_last - self._t_first
        tel.gpu_energy_j = {
            i: (self._energy_last[i] - first) / 1000 for i, first in self._energy_first.items()
        }
        if self._rapl_first is not None and self._rapl_last is not None:
            tel.host_energy_j = self._rapl.joules(self._rapl_first, self._rapl_last)
        if self._nv is not None:
            self._nv.nvmlShutdown()
            self._nv = None
        return tel

    # --- internals -----------------------------------------------------------------------
    def _open_nvml(self) -> None:
        try:
            nv = nvml()
        except ImportError:
            self.tel.notes.append("GPU telemetry absent: nvidia-ml-py is not installed")
            return
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            self.tel.notes.append(f"GPU telemetry absent: NVML unavailable ({type(e).__name__})")
            return
        self._nv = nv
        self._handles = {
            i: nv.nvmlDeviceGetHandleByIndex(i) for i in job_gpu_indices(nv.nvmlDeviceGetCount())
        }

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _query(self, name: str, fn: Any, *args: Any) -> Any:
        """fn(*args), or None when NVML does not support it (noted once)."""
        if name in self._unsupported:
            return None
        try:
            return fn(*args)
        except self._nv.NVMLError as e:
            self._unsupported.add(name)
            self.tel.notes.append(f"{name} absent: NVML {type(e).__name__}")
            return None

    def _sample(self) -> None:
        t = time.time()
        node, values = self.tel.node, {}
        vm = psutil.virtual_memory()
        values[host_key(node, "cpu_utilization_pct")] = psutil.cpu_percent(None)
        values[host_key(node, "memory_used_gib")] = (vm.total - vm.available) / GIB
        nv = self._nv
        for i, h in self._handles.items():
            q = self._query
            util = q("utilization", nv.nvmlDeviceGetUtilizationRates, h)
            mem = q("memory", nv.nvmlDeviceGetMemoryInfo, h)
            power = q("power", nv.nvmlDeviceGetPowerUsage, h)
            reasons_fn = (
                getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or nv.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            got = {
                "utilization_pct": util.gpu if util is not None else None,
                "memory_used_gib": mem.used / GIB if mem is not None else None,
                "power_w": power / 1000 if power is not None else None,
                "temperature_c": q("temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "sm_clock_mhz": q("sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "throttle_reasons": q("throttle_reasons", reasons_fn, h),
                "ecc_uncorrected": q(
                    "ecc",
                    nv.nvmlDeviceGetTotalEccErrors,
                    h,
                    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nv.NVML_VOLATILE_ECC,
                ),
                "pcie_replays": q("pcie_replays", nv.nvmlDeviceGetPcieReplayCounter, h),
            }
            values.update({gpu_key(node, i, k): float(v) for k, v in got.items() if v is not None})
            energy = q("energy_counter", nv.nvmlDeviceGetTotalEnergyConsumption, h)
            if energy is not None:
                self._energy_first.setdefault(i, int(energy))
                self._energy_last[i] = int(energy)
        rapl = self._rapl.read()
        if rapl is not None:
            if self._rapl_first is None:
                self._rapl_first = rapl
            self._rapl_last = rapl
        if not self.tel.samples:
            self._t_first = t
        self._t_last = t
        self.tel.samples.append((t, values))


def gather(tel: NodeTelemetry | None, gather_obj: Any) -> list[NodeTelemetry]:
    """Every node's telemetry on every rank (one all_gather_object); ranks without a sampler
    (local rank != 0) send None."""
    return [t for t in gather_obj(tel) if t is not None]


@dataclass(frozen=True)
class EnergyTotals:
    gpu_j: float | None  # every job GPU on every node; None when no GPU had an energy counter
    host_j: float | None  # every node's RAPL packages; None unless every node had one
    gpus: int  # GPUs with an energy counter
    window_s: float  # the longest node's sampled window
    notes: tuple[str, ...]


def energy_totals(nodes: list[NodeTelemetry]) -> EnergyTotals:
    gpu = [j for t in nodes for j in t.gpu_energy_j.values()]
    hosts = [t.host_energy_j for t in nodes]
    notes = tuple(dict.fromkeys(f"{t.node}: {n}" for t in nodes for n in t.notes))
    return EnergyTotals(
        gpu_j=sum(gpu) if gpu else None,
        host_j=sum(h for h in hosts if h is not None)
        if hosts and all(h is not None for h in hosts)
        else None,
        gpus=len(gpu),
        window_s=max((t.window_s for t in nodes), default=0.0),
        notes=notes,
    )
