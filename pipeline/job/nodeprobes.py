"""The node probes of an attempt: the matmul ceiling (MFU's on a CPU) and the collectives' bus
bandwidth at the job's scale, measured, or reused on a restart.

A requeued point restarts after a stop for a requeue (preempted, timed out, terminated) usually
on the nodes it had: their ceiling and bandwidth are properties of those nodes, measured a few
minutes before. Measuring them again is about a second of every restart on a CPU (0.5 s of
matmuls, 0.6 s of collectives), and more on a GPU node at its real sizes. So a restart reuses
the figures in the point's `probes.json` when all of these hold (`reusable`):

- the previous attempt stopped for a requeue (a StopReason other than a peer failure, after
  which a node may be what failed);
- the same nodes (Slurm's node list of the job; off Slurm the hosts), ranks, device and
  precision, and the same probe settings;
- the figures are at most `train.reuse_probes_s` old (0: always measure).

Rank 0 decides and tells the others (one broadcast), so every rank takes the same path through
the collectives. The run says which it was (`sq.probes`: "measured", or "reused from attempt k,
N s old, the same nodes"). The node health gate is not a probe: it runs on every attempt, on the
figures of this attempt (measured or reused).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.contract.pointdir import PointDir
from pipeline.contract.records import StopReason, StopRecord

REUSE_AFTER = frozenset({StopReason.PREEMPT, StopReason.TIMEOUT, StopReason.TERMINATED})
MEASURED = "measured"


@dataclass(frozen=True)
class ProbeRecord:
    """Where and when the probes ran, under which settings, and what they measured."""

    nodes: list[str]
    world_size: int
    device: str
    precision: str
    settings: dict[str, Any]  # train.measure_ceiling, measure_comm, comm_sizes_mb
    attempt: int
    time: float
    metrics: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ProbeRecord | None:
        try:
            return cls(**data) if data else None
        except TypeError:  # a record of another version: measure again
            return None

    def same_place(self, other: ProbeRecord) -> bool:
        return (self.nodes, self.world_size, self.device, self.precision, self.settings) == (
            other.nodes,
            other.world_size,
            other.device,
            other.precision,
            other.settings,
        )


def settings_of(train: Any) -> dict[str, Any]:
    return {
        "measure_ceiling": bool(train.measure_ceiling),
        "measure_comm": bool(train.measure_comm),
        "comm_sizes_mb": [float(x) for x in train.comm_sizes_mb],
    }


def reusable(
    earlier: ProbeRecord | None, here: ProbeRecord, prev_stop: StopRecord | None, max_age_s: float
) -> ProbeRecord | None:
    """`earlier` when this attempt (`here`, its metrics empty) may reuse its figures: after a
    stop for a requeue, in the same place, no older than `max_age_s`. Pure."""
    if earlier is None or prev_stop is None or max_age_s <= 0:
        return None
    if StopReason(prev_stop.reason) not in REUSE_AFTER:
        return None
    if not earlier.same_place(here) or not 0 <= here.time - earlier.time <= max_age_s:
        return None
    return earlier


def reused_line(earlier: ProbeRecord, now: float) -> str:
    return f"reused from attempt {earlier.attempt}, {now - earlier.time:.0f} s old, the same nodes"


def decide(
    point: PointDir, here: ProbeRecord, prev_stop: StopRecord | None, max_age_s: float, rank: int
) -> ProbeRecord | None:
    """Rank 0's decision, the same on every rank (one broadcast over the job's process group
    when there are several ranks)."""
    mine = None
    if rank == 0:
        mine = reusable(ProbeRecord.from_json(point.read_probes()), here, prev_stop, max_age_s)
    if here.world_size > 1:
        import torch.distributed as dist

        box = [mine]
        dist.broadcast_object_list(box, src=0)
        mine = box[0]
    return mine


def here_now(
    nodes: list[str], world_size: int, device: str, precision: str, train: Any, attempt: int
) -> ProbeRecord:
    return ProbeRecord(list(nodes), world_size, device, precision, settings_of(train), attempt, time.time())
