"""How an attempt's result becomes an outcome: the failure reason of an exception, and the
accept/fail decision once a run has finished. Pure functions of what the run measured."""

from __future__ import annotations

import math
from typing import Any

from pipeline.job.drills import DrillVerdict
from pipeline.job.spec import Outcome
from pipeline.tracking import keys as K


def classify(exc: BaseException) -> tuple[str, str]:
    """(reason, one-line detail) for an exception that ended a run."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    if type(exc).__name__ == "UnsupportedPrecision" or "not supported on your device" in str(exc):
        return K.REASON_UNSUPPORTED_PRECISION, text
    if type(exc).__name__ == "UnsupportedMethod":
        return K.REASON_UNSUPPORTED_METHOD, text
    if "out of memory" in str(exc).lower() or type(exc).__name__ in ("OutOfMemoryError", "MemoryError"):
        return K.REASON_OOM, text
    return K.REASON_CRASH, text


def decide(
    res: Any, target_steps: int, metrics: dict[str, float], final_verified: bool, drills: DrillVerdict
) -> Outcome:
    """Accepted when the run reached its steps, every drill round trip and the final checkpoint
    restored identically, every drill passed, and the loss fell below its bound."""
    if res.end_step < target_steps:
        return Outcome(
            K.OUTCOME_FAILED, K.REASON_TIMEOUT, f"stopped at step {res.end_step} of {target_steps}"
        )
    drill_trips = res.roundtrips[:-1]
    if not all(t.verified for t in drill_trips):
        return Outcome(
            K.OUTCOME_FAILED, K.REASON_DRILL_FAILED, "checkpoint drill: restored state hashes differ"
        )
    if not drills.ok:
        return Outcome(K.OUTCOME_FAILED, K.REASON_DRILL_FAILED, drills.detail)
    if not final_verified:
        return Outcome(
            K.OUTCOME_FAILED, K.REASON_CKPT_NOT_VERIFIED, "final checkpoint: restored state hashes differ"
        )
    final, bound = metrics.get(K.TRAIN_FINAL_LOSS, math.inf), metrics[K.TRAIN_LOSS_BOUND]
    if not final < bound:
        return Outcome(
            K.OUTCOME_FAILED,
            K.REASON_LOSS_BOUND,
            f"final loss {final:.4f} is not below the bound {bound:.4f}",
        )
    return Outcome(K.OUTCOME_ACCEPTED, detail=drills.detail)
