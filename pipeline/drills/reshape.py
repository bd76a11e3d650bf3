"""drill=reshape: after a step, every rank saves and leaves the loop; the job's rank 0 converts
the checkpoint to DeepSpeed's universal format and resumes it on fewer ranks; every step's loss
is compared with the reference run. It does not stop the job, but it starts ranks again.

Its hook, its hand-over and its verify are here; the conversion and the resumed ranks' own
program (`python -m pipeline.job.reshape`, fresh processes) are the job's, called from them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config.checks import require as _require
from pipeline.drills.base import DrillSpec

if TYPE_CHECKING:
    from pipeline.contract.spec import PointEnd
    from pipeline.job.attempt import AttemptContext
    from pipeline.job.drills.base import Verified
    from pipeline.job.reshape import ReshapeResult
    from pipeline.train.trainer import Trainer


@dataclass
class ReshapeDrillConfig:
    enabled: bool = False
    """Resume on another number of ranks through DeepSpeed's universal checkpoint."""
    at_step: int = 10
    """The run saves after this step and goes on with `world_size` ranks, in [1, train.steps)."""
    world_size: int = 1
    """Ranks of the resumed run, >= 1: fewer than the job's, a divisor of them, on its first node."""

    def __post_init__(self) -> None:
        _require(self.at_step >= 1, "drill.reshape.at_step", self.at_step, "an integer >= 1")
        _require(self.world_size >= 1, "drill.reshape.world_size", self.world_size, "an integer >= 1")


class ReshapeDrill:
    """After `at_step`, every rank saves (a collective) and leaves the step loop, handing the
    run over to this drill (pipeline.job.drills.HandOver)."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def after_step(self, trainer: Any, step: int) -> None:
        if step == self.at_step:
            from pipeline.job.drills.base import HandOver
            from pipeline.measure.timeline import Mark

            trainer.save(step)
            trainer.result.timeline[Mark.RESHAPE_SAVED] = time.time()
            raise HandOver(SPEC.name)


def hook(ctx: AttemptContext) -> Any:
    if not ctx.cfg.drill.reshape.enabled:
        return None
    return ReshapeDrill(ctx.cfg.drill.reshape.at_step)


def hand_over_after(cfg: Any) -> int:
    """The step after which the resumed ranks take the run over (an attempt that starts at or
    past it, after an earlier attempt got there, hands over at once)."""
    return int(cfg.reshape.at_step)


def hand_over(attempt: Any, trainer: Trainer) -> ReshapeResult:
    """The reshape drill after the save at at_step: the job's rank 0 converts the checkpoint
    and runs the resumed ranks (pipeline.job.reshape), the others wait for the result (then
    a barrier); the resumed ranks' steps join this run's result."""
    import torch.distributed as dist  # torch: only inside the job's rank

    from pipeline.job.reshape import reshape_on_main_rank, wait_for_result
    from pipeline.measure.timeline import Mark
    from pipeline.tracking import keys as K
    from pipeline.train.checkpoint import LoadStats, SaveStats, tag_for
    from pipeline.train.probes import free_device_memory
    from pipeline.train.progress import DRILL as DRILL_PHASE
    from pipeline.train.trainer import RoundTrip

    res = trainer.result
    attempt.ctx.progress.phase(DRILL_PHASE, "reshape: a universal checkpoint, resumed on fewer ranks")
    trainer.engine = None  # free the job's engine (and its GPU memory) for the resumed ranks
    free_device_memory(attempt.device)
    if attempt.renv.is_main:
        result = reshape_on_main_rank(attempt.ctx.spec.config_yaml, attempt.cfg, attempt.point.path)
    else:
        result = wait_for_result(attempt.point.path)
    dist.barrier()
    if result.error:
        return result
    saved_at = res.timeline.get(Mark.RESHAPE_SAVED)  # None: an earlier attempt saved, and may have resumed
    res.losses.update(result.losses)
    res.end_step = max(res.losses)
    tag = tag_for(res.end_step)
    save = SaveStats(res.end_step, tag, result.ckpt_save_s, result.ckpt_bytes)
    load = LoadStats(res.end_step, tag, result.ckpt_load_s, result.ckpt_bytes, 0, {})
    res.roundtrips.append(RoundTrip(save=save, load=load, verified=result.verified))
    for step, loss in sorted(result.losses.items()):
        attempt.recorder.series({K.TRAIN_LOSS: loss}, step=step)
    attempt.log(
        {
            K.RESHAPE_WORLD_SIZE: result.world_size,
            K.RESHAPE_FROM_STEP: result.from_step,
            K.RESHAPE_CONVERT_S: result.convert_s,
            K.RESHAPE_START_TO_READY_S: result.start_to_ready_s,
            K.RESHAPE_LOAD_S: result.load_s,
            K.RESHAPE_FIRST_STEP_S: result.first_step_s,
            **({K.RESHAPE_TOTAL_S: result.first_step_done_at - saved_at} if saved_at else {}),
        }
    )
    return result


def verify(attempt: Any, trainer: Trainer, result: ReshapeResult) -> Verified | PointEnd:
    """The resumed run's final round trip, and every step's loss against the reference run."""
    from pipeline.contract.outcome import Outcome, Reason
    from pipeline.contract.spec import PointEnd
    from pipeline.job.drills.base import DrillVerdict, Verified
    from pipeline.job.drills.reference import compare_with_reference
    from pipeline.tracking import keys as K

    if result.error:
        return PointEnd(
            Outcome.FAILED,
            Reason.DRILL_FAILED,
            f"reshape to {result.world_size} rank(s): {result.error}",
        )
    verdict, worst = compare_with_reference(attempt, trainer, trainer.result)
    if worst is not None:
        attempt.log({K.RESHAPE_MAX_LOSS_DIFF: worst})
    if verdict.ok:
        verdict = DrillVerdict(
            True,
            f"resumed on {result.world_size} of {attempt.renv.world_size} rank(s) from step {result.from_step} "
            f"through a universal checkpoint; {verdict.detail}",
        )
    return Verified(result.verified, verdict)


SPEC = DrillSpec(
    name="reshape",
    order=50,
    summary="resume on fewer ranks through DeepSpeed's universal checkpoint",
    options=ReshapeDrillConfig,
    doc="Reshape drill (resume on fewer ranks).",
    reference=True,
    resumes_ranks=True,
    hook=hook,
    hand_over_after=hand_over_after,
    hand_over=hand_over,
    verify_hand_over=verify,
)
