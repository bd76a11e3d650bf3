"""The MLflow metrics of a step split by pipeline.train.commtimer (docs/design.md,
"Communication"): here, because pipeline.train knows no MLflow key."""

from __future__ import annotations

from pipeline.tracking import keys as K
from pipeline.train.commtimer import StepSplit


def step_metrics(split: StepSplit, world_size: int) -> dict[str, float]:
    """The MLflow metrics of one split step (pipeline/tracking/keys.py); a bandwidth is absent
    when no time was spent in that collective."""
    c = split.counts
    out = {
        K.PERF_TIMED_STEP_S: split.step_s,
        K.PERF_COMPUTE_S: split.compute_s,
        K.PERF_OPTIMIZER_S: split.optimizer_s,
        K.COMM_EXPOSED_S: split.exposed_s,
        K.COMM_SKEW_S: c.skew_s,
        K.COMM_STEP_BYTES: float(sum(t.nbytes for t in c.ops.values())),
        K.COMM_STEP_WIRE_BYTES: c.wire_bytes,
        K.COMM_STEP_CALLS: float(sum(t.calls for t in c.ops.values())),
    }
    if c.blocked_s > 0 and world_size > 1:
        out[K.COMM_STEP_BUSBW] = c.wire_bytes / c.blocked_s / 1e9
    for op, t in c.ops.items():
        out[K.comm_step_op_bytes(op)] = float(t.nbytes)
        out[K.comm_step_op_calls(op)] = float(t.calls)
        if t.blocked_s > 0 and t.wire_bytes > 0:
            out[K.comm_step_op_busbw(op)] = t.wire_bytes / t.blocked_s / 1e9
    return out
