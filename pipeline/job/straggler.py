"""Stragglers: is one rank slower than the others? (docs/design.md, "Straggler score").

In synchronous data parallelism every rank waits for the slowest at each collective, so step
times are equal on all ranks and cannot name the slow one. Each rank's forward time on its own
device can (CUDA events on a GPU, the rank thread's CPU time on a CPU): under
ZeRO 0-2 no collective runs in the forward, so it is that rank's own compute (under ZeRO-3
the forward gathers parameters and waits for peers, and the score understates). The ranks'
forward times are gathered with one small all_gather per `telemetry.straggler_interval`
steps; the score is the slowest rank's median over the fastest rank's median.

The `straggler` drill slows one rank by a fraction: it sleeps inside that rank's step (in the
forward's window), for the fraction of its own median forward time over the warm-up steps,
spinning rather than sleeping, so the core stays with the rank as it would with a slow GPU."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class StragglerSummary:
    medians_s: list[float]  # per rank, median forward seconds over the timed steps
    score: float  # slowest median / fastest median (>= 1)
    slowest_rank: int
    fastest_rank: int


def summarize(per_rank: list[list[float]]) -> StragglerSummary | None:
    """Per-rank medians and the score; None when a rank has no time or a median is 0."""
    if len(per_rank) < 2 or any(not times for times in per_rank):
        return None
    medians = [statistics.median(times) for times in per_rank]
    if min(medians) <= 0:
        return None
    slow = max(range(len(medians)), key=medians.__getitem__)
    fast = min(range(len(medians)), key=medians.__getitem__)
    return StragglerSummary(medians, medians[slow] / medians[fast], slow, fast)


class StragglerMonitor:
    """A trainer hook: every `interval` steps, one all_gather of the ranks' forward times of
    those steps; steps up to `warmup` are left out. `finish()` gathers what is left."""

    def __init__(self, interval: int, warmup: int, world_size: int, device: str) -> None:
        self.interval, self.warmup, self.world, self.device = interval, warmup, world_size, device
        self.per_rank: list[list[float]] = [[] for _ in range(world_size)]
        self._pending: list[float] = []

    def after_step(self, trainer: Any, step: int) -> None:
        if step > self.warmup:
            self._pending.append(trainer.result.forward_times[step])
        if step % self.interval == 0:
            self._gather()

    def finish(self) -> StragglerSummary | None:
        """On every rank (it is a collective): the rest, then the summary."""
        n = torch.tensor([len(self._pending)], dtype=torch.int64, device=self._dev())
        dist.all_reduce(n, op=dist.ReduceOp.MIN)  # every rank stopped at the same step: equal
        self._pending = self._pending[: int(n.item())]
        self._gather()
        return summarize(self.per_rank)

    def _dev(self) -> str:
        return "cuda" if self.device == "cuda" and dist.get_backend() == "nccl" else "cpu"

    def _gather(self) -> None:
        if not self._pending:
            return
        mine = torch.tensor(self._pending, dtype=torch.float64, device=self._dev())
        out = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(out, mine)
        for rank, t in enumerate(out):
            self.per_rank[rank].extend(t.tolist())
        self._pending = []


class StragglerDrill:
    """drill.straggler: rank `rank` is slowed by `fraction` inside each step's compute window (a
    trainer in-step hook, not a branch of the loop). The pause is fixed once the warm-up steps
    are done: `fraction` x the median of the rank's forward times over those steps (at least
    one). A pause that followed the slowed times would feed on itself on a loaded host."""

    def __init__(self, rank: int, fraction: float, this_rank: int, base_steps: int) -> None:
        self.active = rank == this_rank
        self.fraction = fraction
        self.base_steps = max(1, base_steps)
        self.pause_s: float | None = None

    def in_step(self, trainer: Any, step: int) -> None:
        if not self.active or step <= self.base_steps:
            return
        if self.pause_s is None:
            times = trainer.result.forward_times
            base = [times[s] for s in range(step - self.base_steps, step) if s in times]
            if not base:  # resumed after the base steps: measure again from here
                self.base_steps = step + self.base_steps - 1
                return
            self.pause_s = self.fraction * statistics.median(base)
        end = time.thread_time() + self.pause_s
        while time.thread_time() < end:  # busy for that much CPU time: a slow device still holds
            pass  # its rank's thread, and on a CPU rank the forward's clock is the thread's CPU time
