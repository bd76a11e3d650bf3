"""Collective bandwidth: nccl-tests' algbw / busbw arithmetic.

Definitions follow nccl-tests doc/PERFORMANCE.md: algbw = S / t, where S is the "size" of the
operation, and busbw = algbw * a factor that makes it comparable with the hardware's link speed.
Bandwidths are in bytes/s here; the MLflow keys (comm/*_busbw_gbps) want GB/s = 1e9 bytes/s.
Pure arithmetic; the timed collectives are `pipeline.train.probes.measure_collectives`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
