"""What the interrupting drills share after training: the evidence that they happened
(pipeline.job.evidence), and the uninterrupted reference run every step's loss is compared
with. Functions of the attempt (pipeline.job.runner.Attempt, duck-typed: its cfg, ctx, point,
prior, and its `_trainer`/`_stop_record` for the reference run)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from pipeline.contract.accounting import resume_facts
from pipeline.contract.records import AttemptFacts, KillRecord, Phase
from pipeline.job import drills
from pipeline.job.drills.base import DrillVerdict, RunStopped
from pipeline.job.evidence import missing_evidence
from pipeline.measure.timeline import Mark
from pipeline.train.progress import DRILL

if TYPE_CHECKING:
    from pipeline.train.trainer import Trainer, TrainResult


def verify_evidence(attempt: Any, trainer: Trainer, res: TrainResult) -> DrillVerdict:
    """An interrupting drill passes only on evidence that it happened (pipeline.job.evidence:
    the stop, the save, the requeue, the resume from that checkpoint, on record), with every
    step's loss equal to an uninterrupted reference run with the same seed."""
    cfg = attempt.cfg
    names = drills.interrupting(cfg.drill)
    if not names:
        return DrillVerdict(True)
    facts = [
        *(r.facts(i) for i, r in enumerate(attempt.prior)),
        current_facts(attempt, res),
    ]
    kill = attempt.point.read_kill()
    killed = KillRecord(int(kill["rank"]), int(kill["after_step"])) if kill else None
    rank, timeout_s = cfg.drill.kill_worker.rank, float(cfg.train.pg_timeout_s)
    missing = [m for d in names for m in missing_evidence(d, facts, killed, rank, timeout_s)]
    if missing:
        return DrillVerdict(False, f"drill {'+'.join(names)}: no evidence of " + "; ".join(missing))
    if sorted(res.losses) != list(range(1, cfg.train.steps + 1)):
        return DrillVerdict(
            False, f"steps after resume are not 1..{cfg.train.steps}: {sorted(res.losses)[:5]}..."
        )
    return compare_with_reference(attempt, trainer, res)[0]


def current_facts(attempt: Any, res: TrainResult) -> AttemptFacts:
    """This attempt, as the evidence reads it (its record is written once it ends)."""
    return AttemptFacts.from_record(len(attempt.prior), {**resume_facts(res), **attempt.ctx.slurm_facts()})


def compare_with_reference(
    attempt: Any, trainer: Trainer, res: TrainResult
) -> tuple[DrillVerdict, float | None]:
    """Every step's loss against the uninterrupted reference run; and the largest difference."""
    cfg = attempt.cfg
    if not cfg.drill.reference:
        return DrillVerdict(True, "no reference run (drill.reference=false)"), None
    reference = reference_losses(attempt, trainer)
    tol = cfg.drill.loss_tolerance
    diffs = {s: abs(reference[s] - res.losses.get(s, math.inf)) for s in sorted(reference)}
    worst = max(diffs.values())
    bad = [s for s, d in diffs.items() if d > tol]
    if bad:
        s = bad[0]
        return DrillVerdict(
            False,
            f"loss at step {s} after resume {res.losses.get(s)!r} != uninterrupted reference {reference[s]!r} "
            f"({len(bad)} step(s) differ, tolerance {tol})",
        ), worst
    return DrillVerdict(
        True, f"{len(reference)} losses equal the uninterrupted reference (tolerance {tol})"
    ), worst


def reference_losses(attempt: Any, trainer: Trainer) -> dict[int, float]:
    """The same run, uninterrupted, from the same seed: a second Trainer with no hooks and no
    sink. It checkpoints in its own folder and obeys the same stop flag, so a reference longer
    than what is left of the time limit is resumed by the next attempt like the run itattempt."""
    from pipeline.train.checkpoint import CheckpointManager
    from pipeline.train.trainer import DistComm, checkpoint_group

    cfg, renv = attempt.cfg, attempt.renv
    t0 = time.perf_counter()
    attempt.ctx.progress.phase(DRILL, "reference run: starting")
    trainer.engine = None  # the run's engine is done with; free it before building another
    ref = attempt._trainer(
        CheckpointManager(
            attempt.point.reference,
            cfg.train.checkpoint_interval,
            1,
            renv.rank,
            renv.world_size,
            DistComm(),
            io=cfg.train.checkpoint_io,
            commit_comm=DistComm(checkpoint_group()),
        ),
        progress=attempt.ctx.progress.within(DRILL, "reference run"),
    )
    ref.setup()
    out = ref.train()
    trainer.result.timeline[Mark.REFERENCE_S] = time.perf_counter() - t0
    if out.stopped:
        raise RunStopped(attempt._stop_record(ref, out, phase=Phase.REFERENCE))
    return out.losses
