"""Collective bandwidth: nccl-tests' algbw / busbw arithmetic and a torch.distributed benchmark.

Definitions follow nccl-tests doc/PERFORMANCE.md: algbw = S / t, where S is the "size" of the
operation, and busbw = algbw * a factor that makes it comparable with the hardware's link speed.
Bandwidths are in bytes/s here; the MLflow keys (comm/*_busbw_gbps) want GB/s = 1e9 bytes/s.
torch is imported only inside measure_collectives, so the arithmetic stays light.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def bus_factor(n: int, op: str) -> float:
    """busbw / algbw for n ranks (PERFORMANCE.md): all_reduce 2(n-1)/n, all_gather and
    reduce_scatter (n-1)/n, broadcast and reduce 1. Zero for one rank, except broadcast/reduce."""
    if n < 1:
        raise ValueError(f"need at least one rank, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}; expected one of {OPS}")


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: size / time (PERFORMANCE.md)."""
    if not seconds > 0:
        raise ValueError(f"time must be > 0 s, got {seconds}")
    return nbytes / seconds


def busbw(algbw: float, n: int, op: str) -> float:
    """Bus bandwidth in bytes/s: algbw * bus_factor(n, op)."""
    return algbw * bus_factor(n, op)


class CommSample(NamedTuple):
    """One size of one collective: nccl-tests' size, time (average over iterations and ranks),
    algbw and busbw in bytes/s."""

    size_bytes: int
    time_s: float
    algbw: float
    busbw: float


def plateau(results: Sequence[CommSample] | Sequence[tuple[int, float, float, float]]) -> float | None:
    """Max busbw over the large sizes, those >= a quarter of the largest size measured.

    Small messages are latency-bound, so an average over all sizes says more about the sweep's
    range than about the link; the plateau is what nccl-tests users quote. None for no results.
    """
    if not results:
        return None
    largest = max(r[0] for r in results)
    return max(r[3] for r in results if 4 * r[0] >= largest)


def buffer_elems(op: str, size_bytes: int, world_size: int, elem_size: int) -> tuple[int, int]:
    """(input, output) element counts per rank for a collective of nccl-tests' size.

    all_reduce, broadcast, reduce: size is the buffer, in and out the same. all_gather: size is
    the total output (each rank contributes size/n); reduce_scatter: size is the total input
    (each rank keeps size/n). As nccl-tests does, the count is rounded down to a multiple of the
    ranks (and up to one element per rank at least), so the size actually moved is
    output elems * elem_size for all_gather and input elems * elem_size otherwise.
    """
    bus_factor(world_size, op)  # validates op and world_size
    count = size_bytes // elem_size
    if op in ("all_gather", "reduce_scatter"):
        count = max(world_size, count - count % world_size)
        chunk = count // world_size
        return (chunk, count) if op == "all_gather" else (count, chunk)
    count = max(1, count)
    return count, count


@dataclass(frozen=True)
class CollectiveResult:
    op: str
    world_size: int
    samples: tuple[CommSample, ...]
    plateau_busbw: float | None
    """bytes/s; see plateau()."""

    @property
    def plateau_busbw_gbps(self) -> float | None:
        """GB/s (1e9 bytes/s), the unit of nccl-tests and of the comm/* MLflow keys."""
        return None if self.plateau_busbw is None else self.plateau_busbw / 1e9


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
    import torch
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
