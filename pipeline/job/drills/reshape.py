"""drill=reshape: after a step, every rank saves and leaves the loop; the job's rank 0 converts
the checkpoint to DeepSpeed's universal format and resumes it on fewer ranks
(pipeline.job.reshape runs it); every step's loss is compared with the reference run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.spec import PointEnd
from pipeline.drills.reshape import SPEC
from pipeline.job.drills.base import Drill, DrillVerdict, Verified
from pipeline.measure.timeline import Mark
from pipeline.tracking import keys as K

if TYPE_CHECKING:
    from pipeline.job.attempt import AttemptContext
    from pipeline.job.reshape import ReshapeResult
    from pipeline.train.trainer import Trainer


def _hook(ctx: AttemptContext) -> Any:
    if not ctx.cfg.drill.reshape.enabled:
        return None
    from pipeline.job.reshape import ReshapeDrill

    return ReshapeDrill(ctx.cfg.drill.reshape.at_step)


def hand_over(attempt: Any, trainer: Trainer) -> ReshapeResult:
    """The reshape drill after the save at at_step: the job's rank 0 converts the checkpoint
    and runs the resumed ranks (pipeline.job.reshape), the others wait for the result (then
    a barrier); the resumed ranks' steps join this run's result."""
    import torch.distributed as dist  # torch: only inside the job's rank

    from pipeline.job.reshape import reshape_on_main_rank, wait_for_result
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
    if result.error:
        return PointEnd(
            Outcome.FAILED,
            Reason.DRILL_FAILED,
            f"reshape to {result.world_size} rank(s): {result.error}",
        )
    from pipeline.job.drills.reference import compare_with_reference

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


DRILL = Drill(
    SPEC,
    hook=_hook,
)
