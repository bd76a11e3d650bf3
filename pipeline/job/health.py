"""The pre-flight gate of a node, seconds long, before the fine-tune (docs/design.md, "Node
health"). Per node: NVML checks of the job's GPUs, the matmul ceiling of every GPU and its
spread, the job's all-reduce bus bandwidth against a threshold per GPU type and count (data in
conf/health/, with its source), and DCGM's quick diagnostic (`dcgmi diag -r 1`) when DCGM is
installed. Verdict: healthy, degraded (logged and reported) or failed (the point ends as
node_unhealthy, naming the node).

Failed: an uncorrected ECC error, a pending page retirement or row remap, a failed row remap,
a failed DCGM test, an all-reduce below the threshold. Degraded: clock-event (throttle) reasons
other than idle while idle, a PCIe link narrower or slower than its maximum, an inactive NVLink,
a matmul spread above the limit, a DCGM warning."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract.gpu import job_gpu_indices, nvml

HEALTHY, DEGRADED, FAILED = "healthy", "degraded", "failed"
_ORDER = {HEALTHY: 0, DEGRADED: 1, FAILED: 2}
IDLE_OK_REASONS = 0x1 | 0x2  # GpuIdle, ApplicationsClocksSetting: not a sign of trouble when idle


@dataclass
class NodeHealth:
    node: str
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # checks skipped, and why
    matmul_spread: float | None = None  # (max - min) / max of the node's GPU ceilings

    @property
    def verdict(self) -> str:
        return FAILED if self.failures else DEGRADED if self.warnings else HEALTHY

    def line(self) -> str:
        found = self.failures or self.warnings
        return self.verdict + (": " + "; ".join(found) if found else "")


def worst(verdicts: list[str]) -> str:
    return max(verdicts, key=_ORDER.__getitem__, default=HEALTHY)


def nvml_checks(h: NodeHealth) -> None:
    """The NVML checks of the job's GPUs on this node, into h."""
    try:
        nv = nvml()
    except ImportError:
        h.notes.append("NVML checks skipped: nvidia-ml-py is not installed")
        return
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        h.notes.append(f"NVML checks skipped: NVML unavailable ({type(e).__name__})")
        return
    try:
        for i in job_gpu_indices(nv.nvmlDeviceGetCount()):
            _check_gpu(nv, i, nv.nvmlDeviceGetHandleByIndex(i), h)
    finally:
        nv.nvmlShutdown()


def _ask(nv: Any, h: NodeHealth, what: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except nv.NVMLError as e:
        note = f"{what}: not supported ({type(e).__name__})"
        if note not in h.notes:
            h.notes.append(note)
        return None


def _check_gpu(nv: Any, i: int, handle: Any, h: NodeHealth) -> None:
    ecc = _ask(
        nv,
        h,
        "ECC",
        nv.nvmlDeviceGetTotalEccErrors,
        handle,
        nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nv.NVML_VOLATILE_ECC,
    )
    if ecc:
        h.failures.append(f"GPU {i}: {ecc} uncorrected ECC error(s) since the driver loaded")
    pending = _ask(nv, h, "retired pages", nv.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if pending == nv.NVML_FEATURE_ENABLED:
        h.failures.append(f"GPU {i}: page retirement pending (needs a GPU reset)")
    rows = _ask(nv, h, "row remapping", nv.nvmlDeviceGetRemappedRows, handle)
    if rows is not None:
        _, _, is_pending, failed = rows
        if failed:
            h.failures.append(f"GPU {i}: row remapping failed")
        elif is_pending:
            h.failures.append(f"GPU {i}: row remapping pending (needs a GPU reset)")
    reasons_fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    reasons = _ask(nv, h, "clock-event reasons", reasons_fn, handle)
    if reasons is not None and reasons & ~IDLE_OK_REASONS:
        h.warnings.append(f"GPU {i}: clocks held back while idle (reasons 0x{reasons:x})")
    width = _ask(nv, h, "PCIe width", nv.nvmlDeviceGetCurrPcieLinkWidth, handle)
    max_width = _ask(nv, h, "PCIe width", nv.nvmlDeviceGetMaxPcieLinkWidth, handle)
    if width is not None and max_width is not None and width < max_width:
        h.warnings.append(f"GPU {i}: PCIe link x{width} of x{max_width}")
    gen = _ask(nv, h, "PCIe generation", nv.nvmlDeviceGetCurrPcieLinkGeneration, handle)
    max_gen = _ask(nv, h, "PCIe generation", nv.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    if gen is not None and max_gen is not None and gen < max_gen:
        h.warnings.append(f"GPU {i}: PCIe gen {gen} of gen {max_gen}")
    inactive = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        try:
            if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                inactive.append(link)
        except nv.NVMLError:  # no such link on this GPU (or no NVLink at all)
            break
    if inactive:
        h.warnings.append(f"GPU {i}: NVLink(s) {inactive} inactive")


def matmul_spread(ceilings: list[float]) -> float | None:
    """(fastest - slowest) / fastest of one node's GPU matmul ceilings; None under two GPUs."""
    if len(ceilings) < 2 or max(ceilings) <= 0:
        return None
    return (max(ceilings) - min(ceilings)) / max(ceilings)


def check_matmul(h: NodeHealth, ceilings: list[float], max_spread: float) -> None:
    h.matmul_spread = matmul_spread(ceilings)
    if h.matmul_spread is not None and h.matmul_spread > max_spread:
        h.warnings.append(
            f"matmul ceilings spread {h.matmul_spread:.1%} across the node (limit {max_spread:.0%}; "
            f"{min(ceilings):.1f}..{max(ceilings):.1f} TFLOP/s, median {statistics.median(ceilings):.1f})"
        )


def busbw_threshold(thresholds: dict[str, float], gpu_type: str, gpus_per_node: int) -> float | None:
    """The all-reduce bus bandwidth a node of `gpus_per_node` GPUs of this type must reach (GB/s),
    keyed '<type>x<count>' (h100x8); None when the data has no entry."""
    return thresholds.get(f"{gpu_type.lower()}x{gpus_per_node}")


def check_busbw(h: NodeHealth, busbw_gbps: float | None, threshold: float | None, what: str) -> None:
    if threshold is None:
        h.notes.append(f"all-reduce threshold: none for {what}")
    elif busbw_gbps is None:
        h.notes.append(f"all-reduce threshold {threshold:g} GB/s for {what}: no bandwidth measured")
    elif busbw_gbps < threshold:
        h.failures.append(
            f"all-reduce bus bandwidth {busbw_gbps:.0f} GB/s below {threshold:g} GB/s for {what}"
        )


def parse_dcgm(text: str) -> tuple[list[str], list[str]]:
    """(failed tests, warned tests) in `dcgmi diag -r 1 -j` output: every object of the JSON
    with a `status` of Fail or Warn, named by its nearest `name`/`test_name`."""
    failed: list[str] = []
    warned: list[str] = []

    def walk(node: Any, name: str) -> None:
        if isinstance(node, dict):
            name = str(node.get("name") or node.get("test_name") or name)
            status = str(node.get("status", node.get("result", ""))).lower()
            if status == "fail":
                failed.append(name)
            elif status == "warn":
                warned.append(name)
            for v in node.values():
                walk(v, name)
        elif isinstance(node, list):
            for v in node:
                walk(v, name)

    walk(json.loads(text), "diag")
    return sorted(set(failed)), sorted(set(warned))


def dcgm_diag(h: NodeHealth, timeout_s: float = 120.0) -> None:
    """`dcgmi diag -r 1 -j` (DCGM's quick level) when DCGM is installed; a note when not."""
    if shutil.which("dcgmi") is None:
        h.notes.append("dcgmi diag skipped: DCGM is not installed on this node")
        return
    try:
        out = subprocess.run(
            ["dcgmi", "diag", "-r", "1", "-j"], capture_output=True, text=True, timeout=timeout_s
        )
        failed, warned = parse_dcgm(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        h.notes.append(f"dcgmi diag gave no result ({type(e).__name__}: {str(e)[:120]})")
        return
    h.failures.extend(f"DCGM diag: {t} failed" for t in failed)
    h.warnings.extend(f"DCGM diag: {t} warned" for t in warned)
