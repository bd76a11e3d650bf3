"""The production job's settings, derived from what the qualification measured (docs/design.md,
"Launch"): the batch shape for a global batch, the steps for a token budget, the step time at
the target size, the checkpoint interval in steps, the warning signal's grace and the time
limit of each allocation (with the chain of requeued allocations past MaxTime). Pure functions,
each checked against a hand computation in tests/unit/test_launch_derive.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.measure.projection import chained_jobs

TIME_MARGIN = 0.2
"""--time = the projected wall time x (1 + this) + the signal's grace: a fifth more than the
expectation, an allowance (not a measurement) for the spread of the step time and the
interruptions; the band of WHY.md says how far the projection itself reaches."""
GRACE_SAFETY = 2.0
"""The warning comes this many times (step in flight + the stop's save) before the end."""
SLURM_SIGNAL_RESOLUTION_S = 60
"""sbatch(1), --signal: "the signal may be sent up to 60 seconds earlier than specified":
the grace is a whole number of minutes, at least one."""


@dataclass(frozen=True)
class BatchShape:
    micro_batch: int  # per GPU, at most the micro-batch the search proved
    grad_accum: int
    gpus: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.gpus


def batch_shape(global_batch: int, proven_micro_batch: int, gpus: int) -> BatchShape | None:
    """The largest micro-batch <= the proven one that, with a whole gradient accumulation, makes
    exactly `global_batch` sequences per optimizer step on `gpus` GPUs; None when none does
    (`global_batch` is not a multiple of `gpus`)."""
    if global_batch < 1 or proven_micro_batch < 1 or gpus < 1:
        return None
    for micro in range(min(proven_micro_batch, global_batch // gpus), 0, -1):
        if global_batch % (micro * gpus) == 0:
            return BatchShape(micro, global_batch // (micro * gpus), gpus)
    return None


def steps_for_tokens(tokens: float, global_batch: int, seq_len: int) -> int:
    """Optimizer steps that train at least `tokens` tokens, `global_batch` sequences of
    `seq_len` tokens a step."""
    return max(1, math.ceil(tokens / (global_batch * seq_len)))


def step_s_at(global_batch: int, seq_len: int, tokens_per_s_per_gpu: float, gpus: int) -> float:
    """The step time the projection assumes at the target: a step's tokens / (tokens/s per GPU x
    GPUs)."""
    return global_batch * seq_len / (tokens_per_s_per_gpu * gpus)


def checkpoint_every_steps(interval_s: float | None, step_s: float, steps: int) -> int:
    """The Young/Daly interval (seconds of work) in optimizer steps, rounded to the nearest step,
    at least 1 and at most the run (None: nothing interrupts the job, one checkpoint at the end)."""
    if interval_s is None or not math.isfinite(interval_s):
        return steps
    return max(1, min(steps, round(interval_s / step_s)))


def signal_grace_s(step_s: float, stop_save_s: float) -> int:
    """Seconds before the time limit the warning (USR2) must come so that the ranks finish the
    step in flight and save: GRACE_SAFETY x (step + the slowest stop's save measured), rounded up
    to whole minutes (Slurm's resolution), at least one minute."""
    need = GRACE_SAFETY * (step_s + stop_save_s)
    minutes = max(1, math.ceil(need / SLURM_SIGNAL_RESOLUTION_S))
    return minutes * SLURM_SIGNAL_RESOLUTION_S


@dataclass(frozen=True)
class TimeLimit:
    minutes: int  # --time of each allocation
    jobs: int  # allocations the run takes (1, or the chain past MaxTime)
    need_s: float  # the projected wall time with its margin, the grace left out


def time_limit(
    wall_s: float, restart_s: float, grace_s: int, max_time_min: int | None, margin: float = TIME_MARGIN
) -> TimeLimit | None:
    """--time of each allocation: the projected wall time x (1 + margin) + the grace, in whole
    minutes up, when that fits under MaxTime; else MaxTime for each of a chain of allocations
    (each after the first restarts for `restart_s`; `chained_jobs` over the time each allocation
    can train: MaxTime - grace). None when no allocation could even restart and save in MaxTime."""
    need = wall_s * (1.0 + margin)
    if not math.isfinite(need):
        return None
    if max_time_min is None or need + grace_s <= max_time_min * 60:
        return TimeLimit(math.ceil((need + grace_s) / 60), 1, need)
    usable = max_time_min * 60 - grace_s
    if usable <= 0:
        return None
    jobs = chained_jobs(need, restart_s, usable)
    return None if jobs is None else TimeLimit(max_time_min, jobs, need)


def restarts_allowed(jobs: int, expected_interruptions: float) -> int:
    """The requeues the job may take before it gives up: one per chained allocation, twice the
    expected interruptions, and 3 more (a run that needs more is not the run projected)."""
    return (jobs - 1) + math.ceil(2 * expected_interruptions) + 3


# --- what the login node hands from the measurements to the launch files -------------------


@dataclass(frozen=True)
class Sourced:
    """A number and where it came from: measured in run X, searched, projected, assumed."""

    value: float
    source: str


@dataclass(frozen=True)
class LaunchEvidence:
    """What the qualification says about one candidate's production run (analysis/launch.py
    reads it through MLflow; pipeline/submit/launch.py writes the files from it)."""

    sweep_id: str
    candidate: str
    run_id: str  # the accepted run whose resolved config the job runs
    point_id: str
    accepted_runs: tuple[str, ...]
    parent_run_id: str
    gpus: int  # project.gpus
    tokens: float | None  # project.tokens (or steps)
    steps: int | None
    global_batch: int | None  # project.global_batch; None: the qualified per-GPU batch x GPUs
    smoke_steps: int | None
    inputs: dict[str, tuple[float, str]]  # the projection's inputs (analysis.projection)
    interval_s: float | None  # the Young/Daly checkpoint interval at the rate
    wall_s: tuple[float, float, float]  # at rate/2, rate, 2 x rate
    cost_usd: tuple[float, float, float] | None  # the same; None without a price
    cost_band: tuple[float, float] | None  # every input's range propagated (low, high)
    price: float | None
    proven_micro_batch: Sourced
    stop_save_s: Sourced  # the slowest save at a stop: what the warning must leave time for
    qualified_step_s: Sourced  # the median step time at the qualified size
    qualified_gpus: int
    qualified_global_batch: int


SMOKE_TOLERANCE = 0.25
"""A smoke run's measured step time, and its checkpoint stall, hold the projection's input when
within this fraction above it (an allowance for a short run's noise, not a measurement)."""


@dataclass(frozen=True)
class Check:
    what: str
    projected: float
    measured: float | None

    @property
    def holds(self) -> bool | None:
        """None when the smoke run did not measure it; faster than projected always holds."""
        if self.measured is None:
            return None
        return self.measured <= self.projected * (1.0 + SMOKE_TOLERANCE)

    @property
    def ratio(self) -> float | None:
        return None if self.measured is None or self.projected <= 0 else self.measured / self.projected


def smoke_checks(
    step_s: float, ckpt_stall_s: float, measured_step_s: float | None, measured_stall_s: float | None
) -> list[Check]:
    """The smoke run's step time and checkpoint stall against the projection's inputs."""
    return [
        Check("step time (s)", step_s, measured_step_s),
        Check("checkpoint stall (s)", ckpt_stall_s, measured_stall_s),
    ]
