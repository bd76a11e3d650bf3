"""The attempt's derived numbers (docs/design.md, "The numbers"), as pure functions of what it
measured: throughput and step statistics, FLOPs and MFU, memory headroom, checkpoint rates,
the restart's parts, data wait, and why an attempt stopped. The runner measures and agrees
across ranks; these only compute. No torch, no I/O: each is checked against a hand
computation in tests/unit/test_derived.py."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.contract.records import AttemptRecord, StopReason, StopRecord
from pipeline.measure.flops import mfu
from pipeline.measure.stats import StepStats
from pipeline.measure.timeline import Mark
from pipeline.tracking import keys as K

log = logging.getLogger(__name__)

CLOCK_SKEW_WARN_S = 1.0  # restart parts across hosts: warn when clocks disagree by more than this
TIMEOUT_FRAC = 0.8  # a USR2 past this fraction of the time limit is the limit's warning


def stop_reason(signal_name: str, timeout_drill: bool, elapsed_s: float, limit_s: float) -> StopReason:
    """Why we stopped: SIGTERM (scancel, scontrol requeue) means Slurm decides; a USR2 near the
    time limit (or under the timeout drill) is a time-out; any other USR2 a preemption."""
    if signal_name == "SIGTERM":
        return StopReason.TERMINATED
    if timeout_drill or elapsed_s >= TIMEOUT_FRAC * limit_s:
        return StopReason.TIMEOUT
    return StopReason.PREEMPT


def agreed_signal(seen: Sequence[tuple[str, float | None]]) -> tuple[str, float | None]:
    """The signal that stopped the ranks, from every rank's (signal name, time received): the
    earliest any rank received. A rank can learn of a stop from its peers' flag at a step
    boundary before its own copy of the signal arrives (a warm rank's signal is forwarded by its
    client, one rank after the other): its own name is then empty. ("", None) when no rank got
    one."""
    got = [(when, name) for name, when in seen if name and when is not None]
    if not got:
        return "", None
    when, name = min(got)
    return name, when


def train_metrics(
    end_step: int,
    tokens_per_step: float,
    losses: Mapping[int, float],
    vocab_size: int,
    loss_bound_frac: float,
) -> dict[str, float]:
    """Steps and tokens done, the loss bound (a fraction of ln(vocab), the loss of a uniform
    guess), the first step's loss and the final loss (the mean of the last three steps)."""
    m = {
        K.TRAIN_STEPS: float(end_step),
        K.TRAIN_TOKENS: float(end_step * tokens_per_step),
        K.TRAIN_LOSS_BOUND: loss_bound_frac * math.log(vocab_size),
    }
    if 1 in losses:  # the measured loss of the first step (absent when this attempt lacks it)
        m[K.TRAIN_INITIAL_LOSS] = losses[1]
    if losses:
        m[K.TRAIN_FINAL_LOSS] = statistics.fmean(losses[s] for s in sorted(losses)[-3:])
    return m


def step_metrics(stats: StepStats | None, tokens_per_step: float) -> dict[str, float]:
    """Throughput at the median step, and the step-time statistics; {} with no timed step."""
    if stats is None:
        return {}
    m = {
        K.PERF_TOKENS_PER_S: tokens_per_step / stats.p50_s,
        K.PERF_STEP_P50_S: stats.p50_s,
        K.PERF_STEP_P95_S: stats.p95_s,
        K.PERF_WARMUP_STEPS: float(stats.excluded_steps),
        K.PERF_TIMED_STEPS: float(stats.timed_steps),
    }
    if stats.cv is not None:
        m[K.PERF_STEP_CV] = stats.cv
    return m


def datasheet_peak_flops(
    device: str, gpu_mismatch: str | None, peak_tflops: Mapping[str, float], precision: str
) -> float | None:
    """The partition's datasheet peak FLOP/s, only on the GPU the partition names (never on a
    CPU, nor on another GPU model); None otherwise or when the datasheet has no figure."""
    if device != "cuda" or gpu_mismatch:
        return None
    peak = peak_tflops.get(precision)
    return peak * 1e12 if peak else None


def flops_metrics(
    tokens_per_s: float,
    flops_per_token: float,
    hw_flops_per_token: float | None,
    world_size: int,
    peak_flops: float | None,
    ceiling_tflops: float | None,
    useful_tokens_per_s: float | None = None,
) -> dict[str, float]:
    """Achieved model TFLOP/s per device, MFU and HFU against the datasheet peak (absent
    without one), and the fraction of the measured matmul ceiling (not capped: it may pass 1).
    `tokens_per_s`: every position computed; `useful_tokens_per_s` (padded or packed chat data):
    the real, non-pad tokens. MFU and the achieved model FLOP/s count the useful tokens (the work
    the run does), HFU every position (FLOPs spent on padding are spent too)."""
    useful = tokens_per_s if useful_tokens_per_s is None else useful_tokens_per_s
    achieved = useful * flops_per_token / world_size  # model FLOP/s per device
    m = {K.PERF_ACHIEVED_TFLOPS: achieved / 1e12}
    model = mfu(achieved, peak_flops)
    if model is not None:
        m[K.PERF_MFU] = model
    if hw_flops_per_token:
        hardware = mfu(tokens_per_s * hw_flops_per_token / world_size, peak_flops)
        if hardware is not None:
            m[K.PERF_HFU] = hardware
    if ceiling_tflops:
        m[K.PERF_MFU_VS_CEILING] = achieved / (ceiling_tflops * 1e12)
    return m


def memory_source(peak_gib: Mapping[str, float]) -> str:
    """What the measured peak is: CUDA's max_memory_allocated, else the process's RSS."""
    return "cuda_max_allocated" if "allocated" in peak_gib else "rss"


def memory_metrics(
    peak_gib: Mapping[str, float], capacity_gib: float, estimate_tensors_gib: float
) -> dict[str, float]:
    """The measured peaks (the largest rank's) and the headroom on one basis for both: 1 - peak
    bytes of tensors / capacity. Measured: max_memory_allocated on GPU (RSS on CPU); predicted:
    the model's tensors, without its CUDA context and fragmentation allowance. No headroom
    without a capacity."""
    m = {K.MEM_PEAK_RSS_GIB: peak_gib["rss"]}
    if "allocated" in peak_gib:
        m[K.MEM_PEAK_ALLOCATED_GIB] = peak_gib["allocated"]
        m[K.MEM_PEAK_RESERVED_GIB] = peak_gib["reserved"]
    if capacity_gib > 0:
        used = peak_gib.get("allocated", peak_gib["rss"])
        m[K.MEM_HEADROOM_FRAC] = 1.0 - used / capacity_gib
        m[K.MEM_ESTIMATE_HEADROOM_FRAC] = 1.0 - estimate_tensors_gib / capacity_gib
    return m


def model_states_metrics(measured_bytes: float, modelled_bytes: float) -> dict[str, float]:
    """Parameter and optimizer tensors held (the largest rank), and their ratio to the model's
    figure (absent when the model holds none on the device)."""
    m = {K.MEM_STATES_MEASURED_GIB: measured_bytes / 2**30}
    if modelled_bytes > 0:
        m[K.MEM_STATES_RATIO] = measured_bytes / modelled_bytes
    return m


def checkpoint_metrics(trip: Any) -> dict[str, float]:
    """The last round trip (a RoundTrip: .save, .load, .verified): its times, size, and rates.
    A rate over a time that rounds to 0 is not defined: absent, never 0 GB/s."""
    m = {
        K.CKPT_SAVE_S: trip.save.seconds,
        K.CKPT_STALL_S: trip.save.stalled_s,
        K.CKPT_LOAD_S: trip.load.seconds,
        K.CKPT_BYTES: float(trip.save.bytes),
        K.CKPT_VERIFIED: float(trip.verified),
    }
    for key, io in ((K.CKPT_SAVE_GBPS, trip.save), (K.CKPT_LOAD_GBPS, trip.load)):
        if io.seconds > 0 and io.bytes > 0:
            m[key] = io.bytes / 1e9 / io.seconds
    return m


def checkpoint_counts(
    saves: int, verified: int, fallbacks: int, prior: Sequence[AttemptRecord]
) -> dict[str, float]:
    """Saves and verified round trips over every attempt (this one's plus the records of the
    earlier ones), and this attempt's load fallbacks."""
    return {
        K.CKPT_SAVES: float(saves + sum(p.saves or 0 for p in prior)),
        K.CKPT_VERIFIED_COUNT: float(verified + sum(p.verified or 0 for p in prior)),
        K.CKPT_FALLBACKS: float(fallbacks),
    }


def data_wait_frac(
    step_times: Mapping[int, float], data_wait: Mapping[int, float], warmup: int
) -> float | None:
    """This rank's share of the timed steps spent waiting for batches; None with no timed time."""
    timed = sorted(step_times)[warmup:]
    step_s = sum(step_times[s] for s in timed)
    return sum(data_wait.get(s, 0.0) for s in timed) / step_s if step_s > 0 else None


def eval_metrics(eval_losses: Mapping[int, float], eval_s: float) -> dict[str, float]:
    """Evaluation time, the last evaluation's loss, and the loss before step 1."""
    m = {K.EVAL_TIME_S: eval_s}
    if eval_losses:
        m[K.EVAL_FINAL_LOSS] = eval_losses[max(eval_losses)]
    if 0 in eval_losses:
        m[K.EVAL_FIRST_LOSS] = eval_losses[0]
    return m


@dataclass
class RestartBreakdown:
    """signal -> first optimizer step after resume, in parts that add up to the total."""

    signal_to_exit_s: float
    exit_to_start_s: float
    start_to_ready_s: float
    load_s: float
    first_step_s: float
    lost_steps: int
    reason: str

    @property
    def total_s(self) -> float:
        return (
            self.signal_to_exit_s
            + self.exit_to_start_s
            + self.start_to_ready_s
            + self.load_s
            + self.first_step_s
        )

    def metrics(self) -> dict[str, float]:
        return {
            K.RESTART_SIGNAL_TO_EXIT_S: self.signal_to_exit_s,
            K.RESTART_EXIT_TO_START_S: self.exit_to_start_s,
            K.RESTART_START_TO_READY_S: self.start_to_ready_s,
            K.RESTART_LOAD_S: self.load_s,
            K.RESTART_FIRST_STEP_S: self.first_step_s,
            K.RESTART_TOTAL_S: self.total_s,
            K.RESTART_LOST_STEPS: float(self.lost_steps),
        }

    def lost_s(self, step_times: Mapping[int, float]) -> float | None:
        """The steps the previous attempt did after its last checkpoint, done again here, at
        this attempt's median step time; None with no step timed."""
        return self.lost_steps * statistics.median(step_times.values()) if step_times else None


def breakdown(
    prev: StopRecord, process_start: float, timeline: Mapping[str, float], resumed_step: int
) -> RestartBreakdown:
    """Split the restart after `prev` at the marks this attempt recorded. The first two parts
    subtract wall clocks of different hosts (the signal or kill, the previous attempt's exit,
    this process's start): a part below 0 is clamped at 0, with a warning when the clocks
    disagree by more than CLOCK_SKEW_WARN_S."""
    parts = {
        "signal_to_exit_s": prev.exit_time - prev.signal_time,
        "exit_to_start_s": process_start - prev.exit_time,
        "start_to_ready_s": timeline[Mark.ENGINE_READY] - process_start,
        "load_s": timeline[Mark.LOAD_DONE] - timeline[Mark.ENGINE_READY],
        "first_step_s": timeline[Mark.FIRST_STEP_DONE] - timeline[Mark.LOAD_DONE],
    }
    for name, value in parts.items():
        if value < -CLOCK_SKEW_WARN_S:
            log.warning(
                "restart/%s is %.2f s: the clocks of the hosts disagree by more than %.0f s; the part is counted as 0",
                name,
                value,
                CLOCK_SKEW_WARN_S,
            )
        parts[name] = max(0.0, value)
    return RestartBreakdown(**parts, lost_steps=max(0, prev.stop_step - resumed_step), reason=prev.reason)
