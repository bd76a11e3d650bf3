"""How an attempt's result becomes an outcome: the failure reason of an exception, and the
accept/fail decision once a run has finished. Pure functions of what the run measured."""

from __future__ import annotations

import errno
import math
from enum import Enum
from typing import Any

from pipeline.contract.outcome import Outcome, Reason, disk_full
from pipeline.contract.spec import PointEnd
from pipeline.job.drills import DrillVerdict
from pipeline.tracking import keys as K


class Quality(str, Enum):
    """The quality bar a run must meet to be accepted (`decide`)."""

    TARGET = "target"  # data=tokens|text: an evaluation reached accept.target_eval_loss
    LOSS_BOUND = "loss_bound"  # data=synthetic: the final training loss fell below its bound

    @classmethod
    def for_data(cls, kind: str) -> Quality:
        """The target eval loss on real data; the loss bound on the synthetic task."""
        return cls.LOSS_BOUND if kind == "synthetic" else cls.TARGET


OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "std::bad_alloc")
"""CUDA's OutOfMemoryError, and a CPU allocation refused by the kernel or a memory limit
(PyTorch's DefaultCPUAllocator: "can't allocate memory ... Error code 12")."""


def is_oom(exc: BaseException) -> bool:
    """A real allocation failure, on a GPU or on the CPU."""
    text = str(exc).lower()
    return type(exc).__name__ in ("OutOfMemoryError", "MemoryError") or any(t in text for t in OOM_TEXTS)


PARTITION_FAILURE_ERRNOS = frozenset(
    {errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.ESTALE, errno.ENXIO, errno.ENODEV}
)
"""OSError numbers of the partition's storage and devices failing (a full or read-only file
system, an I/O error, a stale NFS handle), as opposed to a file the user named wrongly."""


def is_partition_failure(exc: BaseException) -> bool:
    """A failure of the partition (a node, a GPU, the interconnect, the storage), by the
    exception's type and origin (pipeline.job.faults), never by words in its message: a
    collective that failed (a peer gone, NCCL, a time-out), the device or its driver (CUDA,
    NVML), or a storage errno. Every other Python exception in the job is the tool's own (or its
    inputs'): a defect to fix, not a result, and no one's labor."""
    from pipeline.job.faults import is_collective_failure, is_device_failure

    if is_collective_failure(exc) or is_device_failure(exc):
        return True
    return isinstance(exc, OSError) and exc.errno in PARTITION_FAILURE_ERRNOS


def classify(exc: BaseException) -> tuple[str, str, str]:
    """(outcome, reason, one-line detail: the exception's type and first line) of an exception
    that ended a run. Results of the candidate: unsupported precision or method, an OOM, a
    crash of the partition (`is_partition_failure`). A drill that could not do its part is
    `drill_failed`. Anything else is the tool's own defect: outcome `error`."""
    from pipeline.job.drills import DrillError

    first = str(exc).splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__
    name = type(exc).__name__
    if isinstance(exc, DrillError):
        return Outcome.FAILED, Reason.DRILL_FAILED, text
    if name == "UnsupportedPrecision" or "not supported on your device" in str(exc):
        return Outcome.FAILED, Reason.UNSUPPORTED_PRECISION, text
    if name == "UnsupportedMethod":
        return Outcome.FAILED, Reason.UNSUPPORTED_METHOD, text
    if is_oom(exc):
        return Outcome.FAILED, Reason.OOM, text
    from pipeline.train.checkpoint import (
        CheckpointSaveError,
    )  # a peer's failed save carries its cause as text

    if full := disk_full(exc, carriers=(CheckpointSaveError,)):  # pipeline.contract.outcome
        return Outcome.FAILED, Reason.DISK_FULL, f"{full}: {text}"
    if is_partition_failure(exc):
        return Outcome.FAILED, Reason.CRASH, text
    return Outcome.ERROR, Reason.TOOL_ERROR, text


def decide(
    res: Any,
    target_steps: int,
    metrics: dict[str, float],
    final_verified: bool,
    drills: DrillVerdict,
    quality: Quality = Quality.LOSS_BOUND,
) -> PointEnd:
    """Accepted when the run reached its steps, every drill round trip and the final checkpoint
    restored identically, every drill passed, and it met its quality bar: with
    quality="target" (data=tokens|text) an evaluation reached the target eval loss; with
    "loss_bound" (data=synthetic) the final training loss fell below its bound."""
    if res.end_step < target_steps:
        return PointEnd(Outcome.FAILED, Reason.TIMEOUT, f"stopped at step {res.end_step} of {target_steps}")
    drill_trips = res.roundtrips[:-1]
    if not all(t.verified for t in drill_trips):
        return PointEnd(Outcome.FAILED, Reason.DRILL_FAILED, "checkpoint drill: restored state hashes differ")
    if not drills.ok:
        return PointEnd(Outcome.FAILED, Reason.DRILL_FAILED, drills.detail)
    if not final_verified:
        return PointEnd(
            Outcome.FAILED, Reason.CKPT_NOT_VERIFIED, "final checkpoint: restored state hashes differ"
        )
    if quality == Quality.TARGET:
        target = metrics.get(K.TARGET_EVAL_LOSS)
        if K.TARGET_STEPS not in metrics:
            best = min(res.eval_losses.values(), default=math.inf)
            return PointEnd(
                Outcome.FAILED,
                Reason.TARGET_NOT_REACHED,
                f"eval loss never reached the target {target if target is not None else math.nan:.4f} in "
                f"{target_steps} steps (best {best:.4f})",
            )
        detail = f"reached eval loss {target:.4f} at step {metrics[K.TARGET_STEPS]:.0f}"
        return PointEnd(Outcome.ACCEPTED, detail=f"{drills.detail}; {detail}" if drills.detail else detail)
    final, bound = metrics.get(K.TRAIN_FINAL_LOSS, math.inf), metrics[K.TRAIN_LOSS_BOUND]
    if not final < bound:
        return PointEnd(
            Outcome.FAILED,
            Reason.LOSS_BOUND,
            f"final loss {final:.4f} is not below the bound {bound:.4f}",
        )
    return PointEnd(Outcome.ACCEPTED, detail=drills.detail)


def target_metrics(
    eval_losses: dict[int, float],
    target: float | None,
    step_p50_s: float | None,
    ranks: int,
    usd_per_gpu_hour: float | None,
) -> dict[str, float]:
    """Steps, compute time, GPU-hours and cost to reach the target eval loss: the first
    evaluated step at or below it, at the run's median step time (start-up, evaluations,
    checkpoints and restarts excluded). Absent what cannot be computed."""
    if target is None:
        return {}
    out = {K.TARGET_EVAL_LOSS: target}
    reached = [s for s in sorted(eval_losses) if eval_losses[s] <= target]
    if not reached:
        return out
    out[K.TARGET_STEPS] = float(reached[0])
    if step_p50_s is not None:
        out[K.TARGET_TIME_S] = reached[0] * step_p50_s
        out[K.TARGET_GPU_HOURS] = out[K.TARGET_TIME_S] * ranks / 3600
        if usd_per_gpu_hour is not None:
            out[K.TARGET_USD] = out[K.TARGET_GPU_HOURS] * usd_per_gpu_hour
    return out
