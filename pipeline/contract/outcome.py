"""How a point ends, stated once: the outcome and the failure reason, as enums. Their values
are what MLflow's `sq.outcome` / `sq.reason` tags, the point's `outcome.json` and the report
hold (unchanged strings: a `StrEnum` member is its value), so a run logged before these enums
existed reads the same. docs/design.md, "Outcomes", defines each.

No other module spells one of these values by hand (tests/unit/test_enums.py)."""

from __future__ import annotations

import errno
from enum import StrEnum


class Outcome(StrEnum):
    """Where a point stands, and how it ended."""

    ACCEPTED = "accepted"
    FAILED = "failed"
    ERROR = "error"
    """The tool's own defect (a Python exception in slurm-qualify's code or from its inputs): not
    a result of the candidate, not counted against its partition, charged no recovery labor."""
    RUNNING = "running"
    SUBMITTED = "submitted"


FINAL = (Outcome.ACCEPTED, Outcome.FAILED, Outcome.ERROR)
"""The outcomes that end a point (a sweep's summary counts these)."""


class Reason(StrEnum):
    """Why a point failed (or ended in error)."""

    UNSUPPORTED_PRECISION = "unsupported_precision"
    UNSUPPORTED_METHOD = "unsupported_method"
    """qlora where bitsandbytes 4-bit cannot run."""
    OOM = "oom"
    DOES_NOT_FIT = "does_not_fit"
    """Predicted by the memory model, not run."""
    CRASH = "crash"
    INTERRUPTED = "interrupted"
    """The embedded default's sweep was stopped (Ctrl-C) before it ended."""
    TIMEOUT = "timeout"
    DRILL_FAILED = "drill_failed"
    CKPT_NOT_VERIFIED = "checkpoint_not_verified"
    LOSS_BOUND = "loss_above_bound"
    PREEMPT_CANCELLED = "preempt_cancelled"
    """The partition cancels instead of requeueing."""
    TARGET_NOT_REACHED = "target_not_reached"
    """Eval loss above accept.target_eval_loss at the end."""
    DISK_FULL = "disk_full"
    """The partition's storage was full (ENOSPC) or the user's quota exceeded (EDQUOT); named in
    the detail. The previous checkpoint stays the one a resume loads."""
    NODE_UNHEALTHY = "node_unhealthy"
    """A node failed the pre-flight health gate (named in the detail)."""
    TOOL_ERROR = "tool_error"
    """Outcome error: an exception of the tool's own code (type and first line in the detail)."""
    PREEMPTED = "preempted"
    """Preempted more than launcher.max_restarts times."""
    CANCELLED = "cancelled"
    """The job was cancelled (scancel) before it wrote an outcome."""


DISK_FULL = {
    errno.ENOSPC: ("the partition's storage is full", "no space left on device"),
    errno.EDQUOT: ("the user's disk quota is exceeded", "disk quota exceeded"),
}
"""A full disk, by errno, and the text its strerror reads (a peer rank has only the text)."""


def disk_full(exc: BaseException, carriers: tuple[type[BaseException], ...] = ()) -> str | None:
    """What was full (the partition's storage, or the user's quota) when the exception or one
    of its causes is an OSError of a full disk; None otherwise. Only an exception of a
    `carriers` type is read as text (strerror's words): one that carries another process's
    cause as text (a peer rank's failed save; a dead job's log tail). Never the words of any
    other exception (issue 46: a message is not a classification)."""
    seen: BaseException | None = exc
    for _ in range(10):  # the chain: a CheckpointSaveError raised from the OSError
        if seen is None:
            break
        for number, (what, text) in DISK_FULL.items():
            if isinstance(seen, OSError) and seen.errno == number:
                return what
            if isinstance(seen, carriers) and text in str(seen).lower():
                return what
        seen = seen.__cause__ or seen.__context__
    return None


NEEDS_PERSON = (Reason.CRASH, Reason.CKPT_NOT_VERIFIED, Reason.DISK_FULL)
"""Failure reasons that end a point for good and need an engineer to repair the partition: a
crash of the partition itself (a node, a GPU, the interconnect or the storage failed, workers
failing past launcher.max_restarts included), a final checkpoint that did not restore, a full
disk (the partition's storage, or the user's quota: someone frees space). Nobody
is needed for what the scheduler does by design (a preemption, a requeue, a time limit, a
partition that cancels preempted jobs), for a drill (its failure is a measurement), for what
the qualification measures about the candidate (OOM, does-not-fit, an unsupported precision or
method, a loss above its bound), for a cancelled or interrupted sweep, nor for the tool's own
defects (outcome `error`: fixed in the tool, not charged to the partition)."""
