"""Measurements a job takes besides the training itself: step-time statistics, a matmul
ceiling, peak memory, and a fingerprint of the training state for restore verification."""

from __future__ import annotations

import gc
import hashlib
import math
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StepStats:
    p50_s: float
    p95_s: float
    cv: float  # coefficient of variation: stdev / mean
    timed_steps: int
    excluded_steps: int


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def step_stats(step_times: Sequence[float], warmup: int) -> StepStats | None:
    """Statistics of the steps after warm-up; None when no step is left to time."""
    timed = list(step_times[warmup:])
    if not timed:
        return None
    mean = statistics.fmean(timed)
    cv = statistics.pstdev(timed) / mean if len(timed) > 1 and mean > 0 else 0.0
    return StepStats(
        percentile(timed, 50), percentile(timed, 95), cv, len(timed), min(warmup, len(step_times))
    )


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure_matmul_tflops(device: str, dtype: torch.dtype, seconds: float = 0.5) -> float:
    """Best achieved TFLOP/s of a square matmul on this device and dtype: the ceiling that
    MFU is also reported against (on a CPU, the only one). 2*n^3 FLOPs per product."""
    n = 4096 if device == "cuda" else 512
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    for _ in range(2):
        a @ b
    sync(device)
    best = 0.0
    deadline = time.perf_counter() + seconds
    reps = 1
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        sync(device)
        dt = time.perf_counter() - t0
        best = max(best, 2 * n**3 * reps / dt / 1e12)
        if dt < 0.02:
            reps *= 2
    return best


def reset_peak_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def free_device_memory(device: str) -> None:
    """Give back what the dropped engines held, for other processes on the same GPU."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def peak_memory_gib(device: str) -> dict[str, float]:
    """Peak memory of this rank: CUDA allocator peaks on a GPU, process peak RSS always."""
    out = {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30}  # KiB on Linux
    if device == "cuda":
        out["allocated"] = torch.cuda.max_memory_allocated() / 2**30
        out["reserved"] = torch.cuda.max_memory_reserved() / 2**30
    return out


def _feed(h: Any, obj: Any, depth: int = 0) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode())
            _feed(h, obj[k], depth + 1)
    elif isinstance(obj, list | tuple):
        for x in obj:
            _feed(h, x, depth + 1)
    elif isinstance(obj, bool | int | float | str | type(None)):
        h.update(repr(obj).encode())
    elif depth < 4 and hasattr(obj, "__dict__"):
        _feed(h, vars(obj), depth + 1)
    else:  # an opaque object (a loss scaler's lock, say): its type is all that is stable
        h.update(type(obj).__name__.encode())


def state_fingerprint(engine: Any) -> str:
    """sha256 of this rank's training state: its parameters (its ZeRO-3 shard) and its
    optimizer state (fp32 master partitions and Adam moments, as the optimizer saves them)."""
    h = hashlib.sha256()
    for name, p in engine.module.named_parameters():
        h.update(name.encode())
        _feed(h, getattr(p, "ds_tensor", p.data))
    _feed(h, engine.optimizer.state_dict())
    h.update(str(engine.global_steps).encode())
    return h.hexdigest()
