"""From a short qualification run to the production run it stands for: the checkpoint interval,
the expected wall time under interruptions, and what finishing costs. Pure functions.

The model (docs/design.md, "Projection"), the one the simulator in `pipeline.measure.simulate`
runs event by event:

- The run needs `work_s` seconds of training on `gpus` GPUs, after a first start of `start_s`.
- Interruptions arrive as a Poisson process, `rate_per_gpu_hour` per GPU-hour, so a job of
  `gpus` GPUs is interrupted at rate lambda = rate * gpus per hour (memoryless: the time since
  the last interruption does not matter, J. T. Daly 2006, "A higher order estimate of the optimum
  checkpoint interval for restart dumps", FGCS 22(3)).
- Training is cut into segments of `interval_s` seconds of work, each followed by a checkpoint
  that stalls training for `ckpt_stall_s` (the last segment is shorter, and is checkpointed too:
  an accepted output is a restorable checkpoint). An interruption loses the segment in progress;
  the job then pays `restart_s` (signal to first step: requeue, start-up, load), which can itself
  be interrupted, and redoes the segment.
- A segment of length L (work + stall) then takes, in expectation (Daly 2006, eq. 8):
      E[T(L)] = (1/lambda) * exp(lambda * R) * (exp(lambda * L) - 1)
  which tends to L as lambda -> 0.
- Young's interval (J. W. Young 1974) is sqrt(2 * C * M), C the checkpoint stall and M = 1/lambda
  the mean time between interruptions of the job; Daly's first-order correction subtracts C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOUR_S = 3600.0

# Llama 3 pre-training (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4): 419
# unexpected interruptions in 54 days on 16,384 H100 GPUs.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPU_HOURS = 54 * 24 * 16384
DEFAULT_RATE_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / LLAMA3_GPU_HOURS  # about 1.97e-5
DEFAULT_RATE_SOURCE = (
    "Llama 3 pre-training: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs "
    "(Dubey et al. 2024, section 3.3.4)"
)


@dataclass(frozen=True)
class RunModel:
    """A production run as the projection sees it (seconds, GPUs, interruptions per GPU-hour)."""

    work_s: float  # training time the run needs when nothing goes wrong
    gpus: int
    rate_per_gpu_hour: float  # interruptions per GPU-hour
    ckpt_stall_s: float  # time a checkpoint stops training
    restart_s: float  # an interruption's cost before training goes on (signal -> first step)
    start_s: float = 0.0  # the first start (start -> first step), paid once

    def __post_init__(self) -> None:
        for name in ("work_s", "rate_per_gpu_hour", "ckpt_stall_s", "restart_s", "start_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {self.gpus}")

    @property
    def rate_per_s(self) -> float:
        """lambda: interruptions per second of the whole job."""
        return self.rate_per_gpu_hour * self.gpus / HOUR_S

    @property
    def mtbi_s(self) -> float | None:
        """Mean time between interruptions of the job; None when there are none."""
        return 1.0 / self.rate_per_s if self.rate_per_s > 0 else None


def young_daly_interval_s(ckpt_stall_s: float, mtbi_s: float | None) -> float | None:
    """Young's optimum checkpoint interval sqrt(2 C M) (seconds of work between checkpoints);
    None when nothing interrupts the job (then one final checkpoint is optimal)."""
    if mtbi_s is None or ckpt_stall_s <= 0:
        return None
    return math.sqrt(2.0 * ckpt_stall_s * mtbi_s)


def segments(work_s: float, interval_s: float) -> list[float]:
    """The work of each checkpointed segment: full intervals, then the remainder (for the
    simulator, which walks them one by one; expected_wall_s never lists them)."""
    full, rest = segment_counts(work_s, interval_s)
    return [interval_s] * int(full) + ([rest] if rest > 0 else [])


def segment_counts(work_s: float, interval_s: float) -> tuple[float, float]:
    """(how many full intervals, the remainder's work): constant work whatever the run's size."""
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    full = math.floor(work_s / interval_s)
    rest = work_s - full * interval_s
    if rest < 0:  # work_s / interval_s rounded up to the next integer
        full, rest = full - 1, rest + interval_s
    return float(full), (rest if rest > 1e-9 * interval_s else 0.0)


def expected_segment_s(length_s: float, restart_s: float, rate_per_s: float) -> float:
    """Daly's E[T(L)]: expected time to get `length_s` done uninterrupted, with restarts;
    infinite when the exponent is past what a float holds (the run would practically never end)."""
    if rate_per_s == 0:
        return length_s
    if rate_per_s * (restart_s + length_s) > 700:  # exp(709) is the largest finite double
        return math.inf
    # expm1 keeps the small-rate limit exact: (e^{lambda L} - 1) / lambda -> L
    return math.exp(rate_per_s * restart_s) * math.expm1(rate_per_s * length_s) / rate_per_s


def expected_wall_s(run: RunModel, interval_s: float) -> float:
    """Expected wall time of the run with a checkpoint every `interval_s` seconds of work: the
    full segments are alike, so their count multiplies one segment's expectation (the work does
    not grow with the run's size)."""
    lam = run.rate_per_s
    full, rest = segment_counts(run.work_s, interval_s)
    wall = run.start_s + full * expected_segment_s(interval_s + run.ckpt_stall_s, run.restart_s, lam)
    if rest > 0:
        wall += expected_segment_s(rest + run.ckpt_stall_s, run.restart_s, lam)
    return wall


@dataclass(frozen=True)
class Projection:
    """What finishing the run costs at one interruption rate."""

    rate_per_gpu_hour: float
    interval_s: float  # checkpoint interval used (seconds of work)
    wall_s: float  # expected wall time
    effective_ratio: float  # work / wall: the share of the allocation that trains
    gpu_hours: float
    cost_usd: float | None  # None without a price


def project(
    run: RunModel, price_usd_per_gpu_hour: float | None, interval_s: float | None = None
) -> Projection:
    """The run at its rate, checkpointing at `interval_s` (default: Young's interval, or once
    at the end when nothing interrupts the job)."""
    if interval_s is None:
        interval_s = young_daly_interval_s(run.ckpt_stall_s, run.mtbi_s) or max(run.work_s, 1e-9)
    wall = expected_wall_s(run, interval_s)
    gpu_hours = wall * run.gpus / HOUR_S
    return Projection(
        rate_per_gpu_hour=run.rate_per_gpu_hour,
        interval_s=interval_s,
        wall_s=wall,
        effective_ratio=run.work_s / wall if wall > 0 else 1.0,
        gpu_hours=gpu_hours,
        cost_usd=None if price_usd_per_gpu_hour is None else gpu_hours * price_usd_per_gpu_hour,
    )


def project_band(
    run: RunModel, price_usd_per_gpu_hour: float | None
) -> tuple[Projection, Projection, Projection]:
    """The projection at half, at, and at twice the interruption rate; each checkpoints at its
    own Young interval (what an operator would set knowing that rate)."""
    half = RunModel(**{**run.__dict__, "rate_per_gpu_hour": run.rate_per_gpu_hour / 2})
    double = RunModel(**{**run.__dict__, "rate_per_gpu_hour": run.rate_per_gpu_hour * 2})
    return (
        project(half, price_usd_per_gpu_hour),
        project(run, price_usd_per_gpu_hour),
        project(double, price_usd_per_gpu_hour),
    )


def work_s_for_tokens(tokens: float, tokens_per_s_per_gpu: float, gpus: int) -> float:
    """Training time for `tokens` at a measured per-GPU throughput, scaled linearly to `gpus`
    (an assumption the report states: scaling efficiency at the target size is not measured)."""
    if tokens_per_s_per_gpu <= 0:
        raise ValueError(f"tokens_per_s_per_gpu must be > 0, got {tokens_per_s_per_gpu}")
    return tokens / (tokens_per_s_per_gpu * gpus)


# --- time to result: the queue before and between the production run's jobs ---------------


@dataclass(frozen=True)
class QueueModel:
    """How long the production run waits in one partition's queue (docs/design.md, "Time to
    result"): its first job's start as the scheduler estimated it when asked (`sbatch
    --test-only`: a snapshot, dated by whoever asked), and each later chained job's wait, from
    the waits measured on that partition (sacct Eligible -> Start of the qualification's own
    jobs: their lowest, median and highest)."""

    first_wait_s: float
    later_wait_s: tuple[float, float, float]  # low, mid, high
    max_job_s: float | None = None
    """The partition's MaxTime: the longest one job may run. None: one job runs it all."""

    def __post_init__(self) -> None:
        values = (
            self.first_wait_s,
            *self.later_wait_s,
            *([self.max_job_s] if self.max_job_s is not None else []),
        )
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"queue waits and MaxTime must be finite numbers >= 0, got {values!r}")
        low, mid, high = self.later_wait_s
        if not low <= mid <= high:
            raise ValueError(f"later_wait_s must be (low, mid, high), got {self.later_wait_s!r}")
        if self.max_job_s == 0:
            raise ValueError("max_job_s must be > 0 (or None: no limit)")


@dataclass(frozen=True)
class TimeToResult:
    """From the question to the accepted output: waiting, then computing."""

    jobs: int  # the chained jobs the run needs under MaxTime
    wait_s: float  # the first job's wait plus every later job's
    compute_s: float  # the projected wall time plus a restart at every job boundary
    total_s: float


def chained_jobs(wall_s: float, restart_s: float, max_job_s: float | None) -> int | None:
    """How many jobs of at most `max_job_s` the run's `wall_s` of work takes when every job after
    the first spends `restart_s` of its time restarting (1 without a limit); None when a job
    could not even restart within the limit."""
    if max_job_s is None or wall_s <= max_job_s:
        return 1
    if restart_s >= max_job_s:
        return None
    return 1 + math.ceil((wall_s - max_job_s) / (max_job_s - restart_s))


def time_to_result(wall_s: float, restart_s: float, queue: QueueModel, later_wait_s: float) -> TimeToResult:
    """The run's time to result when each later chained job waits `later_wait_s`: the first
    job's wait, then the projected wall time cut at MaxTime into chained jobs, each boundary a
    planned restart (a new job: wait, start, load) of `restart_s` and a wait. Infinite when the
    wall time is, or when no job could restart within MaxTime."""
    jobs = chained_jobs(wall_s, restart_s, queue.max_job_s) if math.isfinite(wall_s) else None
    if jobs is None:
        return TimeToResult(1, queue.first_wait_s, math.inf, math.inf)
    compute = wall_s + (jobs - 1) * restart_s
    wait = queue.first_wait_s + (jobs - 1) * later_wait_s
    return TimeToResult(jobs, wait, compute, wait + compute)


def time_to_result_band(
    walls_s: tuple[float, float, float], restart_s: float, queue: QueueModel
) -> tuple[TimeToResult, TimeToResult, TimeToResult]:
    """Low, central and high time to result: the projection's wall times at half, at and at twice
    the interruption rate (`project_band`), each with the lowest, median and highest later wait."""
    return (
        time_to_result(walls_s[0], restart_s, queue, queue.later_wait_s[0]),
        time_to_result(walls_s[1], restart_s, queue, queue.later_wait_s[1]),
        time_to_result(walls_s[2], restart_s, queue, queue.later_wait_s[2]),
    )
