"""The marks of an attempt's timeline (`TrainResult.timeline`), each named once: the trainer
sets the wall-clock marks of its start-up and loop, the job adds its own (pipeline.job:
`runner`, `reshape`) and reads them for the restart breakdown, the start-up time and the
cold start. Here, not in pipeline.train, because the login node's accounting reads them too and
never loads the trainer. Standard library only."""

from __future__ import annotations

from enum import StrEnum


class Mark(StrEnum):
    """A key of `TrainResult.timeline` (a str: the dict is keyed by these values)."""

    ENGINE_READY = "engine_ready"
    """The DeepSpeed engine is built (wall clock, time.time())."""
    LOAD_DONE = "load_done"
    """The checkpoint to resume from is loaded, or none was to be (wall clock)."""
    FIRST_STEP_DONE = "first_step_done"
    """The attempt's first optimizer step finished (wall clock)."""
    STOP_SAVED = "stop_saved"
    """The checkpoint a stop asked for is committed (wall clock)."""
    RESHAPE_SAVED = "reshape_saved"
    """The reshape drill's checkpoint is committed (wall clock; set by pipeline.job.reshape)."""
    REFERENCE_S = "reference_s"
    """Seconds a drill's uninterrupted reference run took (a duration, not a time; set by
    pipeline.job.runner): part of the attempt's drills_s."""
    PACED_S = "paced_s"
    """Seconds the ranks slept between steps under a drill's pace (a duration; set by the
    time-out drill's step floor, pipeline.drills.timeout): part of the attempt's drills_s."""
