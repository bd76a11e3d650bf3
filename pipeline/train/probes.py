"""Measurements a job takes on its device besides the training itself: a matmul ceiling,
collective bandwidth, peak memory, and a fingerprint of the training state for restore
verification. The arithmetic on what they measure is in `pipeline.measure` (pure)."""

from __future__ import annotations

import gc
import hashlib
import resource
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from pipeline.measure.comm import CollectiveResult, CommSample, algbw, buffer_elems, busbw, plateau


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


def measure_collectives(
    sizes_bytes: Sequence[int],
    iters: int = 20,
    warmup: int = 5,
    ops: Sequence[str] = ("all_reduce", "all_gather"),
    device: str = "cpu",
    dtype: str = "float32",
) -> dict[str, CollectiveResult]:
    """Time real collectives in the already initialised default process group.

    Call on every rank (gloo on CPU, nccl with device="cuda:<local rank>"). For each op and size:
    `warmup` untimed calls, a barrier, then `iters` back-to-back calls timed together (CUDA
    synchronised before reading the clock), time per call averaged over the ranks as nccl-tests
    does by default (-a 1). Every rank returns the same numbers.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("measure_collectives needs an initialised torch.distributed process group")
    if iters < 1 or warmup < 0:
        raise ValueError(f"need iters >= 1 and warmup >= 0, got {iters}, {warmup}")
    n, dev, dt = dist.get_world_size(), torch.device(device), getattr(torch, dtype)
    elem = torch.empty((), dtype=dt).element_size()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    out: dict[str, CollectiveResult] = {}
    for op in ops:
        samples = []
        for size in sizes_bytes:
            n_in, n_out = buffer_elems(op, size, n, elem)
            # zeros: repeated sums of ones would overflow to inf after ~128 all_reduces
            src = torch.zeros(n_in, dtype=dt, device=dev)
            dst = torch.empty(n_out, dtype=dt, device=dev)
            call = {
                "all_reduce": partial(dist.all_reduce, src),
                "all_gather": partial(dist.all_gather_into_tensor, dst, src),
                "reduce_scatter": partial(dist.reduce_scatter_tensor, dst, src),
                "broadcast": partial(dist.broadcast, src, 0),
                "reduce": partial(dist.reduce, src, 0),
            }[op]
            for _ in range(warmup):
                call()
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            sync()
            elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=dev)
            dist.all_reduce(elapsed)
            t = elapsed.item() / n
            nbytes = (n_out if op == "all_gather" else n_in) * elem
            alg = algbw(nbytes, t)
            samples.append(CommSample(nbytes, t, alg, busbw(alg, n, op)))
        out[op] = CollectiveResult(op, n, tuple(samples), plateau(samples))
    return out
