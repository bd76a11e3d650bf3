"""When a restart reuses its point's node probes (pipeline/job/nodeprobes.reusable): after a
stop for a requeue, in the same place, young enough; never after a peer failure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.contract.records import StopReason, StopRecord
from pipeline.job.nodeprobes import ProbeRecord, reusable, reused_line

SETTINGS = {"measure_ceiling": True, "measure_comm": True, "comm_sizes_mb": [1.0, 4.0, 16.0]}
EARLIER = ProbeRecord(
    ["a100-1"], 2, "cpu", "bf16", SETTINGS, 0, 1000.0, {"perf/measured_ceiling_tflops": 1.5}
)
HERE = replace(EARLIER, attempt=1, time=1600.0, metrics={})


def stop(reason: StopReason) -> StopRecord:
    return StopRecord(reason=reason, signal_time=900.0, exit_time=950.0, stop_step=7, saved_step=5)


@pytest.mark.parametrize("reason", [StopReason.PREEMPT, StopReason.TIMEOUT, StopReason.TERMINATED])
def test_a_restart_after_a_requeue_in_the_same_place_reuses(reason: StopReason) -> None:
    assert reusable(EARLIER, HERE, stop(reason), 3600.0) is EARLIER
    assert reused_line(EARLIER, HERE.time) == "reused from attempt 0, 600 s old, the same nodes"


@pytest.mark.parametrize(
    ("here", "prev", "max_age", "why"),
    [
        (HERE, stop(StopReason.PEER_FAILURE), 3600.0, "a peer failure: a node may be what failed"),
        (HERE, None, 3600.0, "no stop: the first attempt, or one after a crash"),
        (replace(HERE, nodes=["a100-2"]), stop(StopReason.PREEMPT), 3600.0, "another node"),
        (replace(HERE, world_size=4), stop(StopReason.PREEMPT), 3600.0, "other ranks (a reshape)"),
        (replace(HERE, precision="fp32"), stop(StopReason.PREEMPT), 3600.0, "another dtype's ceiling"),
        (replace(HERE, device="cuda"), stop(StopReason.PREEMPT), 3600.0, "another device"),
        (
            replace(HERE, settings={**SETTINGS, "comm_sizes_mb": [64.0]}),
            stop(StopReason.PREEMPT),
            3600.0,
            "sizes",
        ),
        (replace(HERE, time=1000.0 + 3601.0), stop(StopReason.PREEMPT), 3600.0, "older than the limit"),
        (replace(HERE, time=999.0), stop(StopReason.PREEMPT), 3600.0, "from the future: a clock step"),
        (HERE, stop(StopReason.PREEMPT), 0.0, "train.reuse_probes_s=0: always measure"),
    ],
)
def test_otherwise_the_restart_measures(
    here: ProbeRecord, prev: StopRecord | None, max_age: float, why: str
) -> None:
    assert reusable(EARLIER, here, prev, max_age) is None, why


def test_no_record_or_a_record_of_another_shape_is_measured_again() -> None:
    assert reusable(None, HERE, stop(StopReason.PREEMPT), 3600.0) is None
    assert ProbeRecord.from_json(None) is None
    assert ProbeRecord.from_json({"nodes": ["x"], "unknown_field": 1}) is None
    assert ProbeRecord.from_json(EARLIER.as_json()) == EARLIER
