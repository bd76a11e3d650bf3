"""The attempt's derived numbers (pipeline.job.derived) against hand computations: each
expected value below is worked out in the comment beside it, not by the function under test."""

from __future__ import annotations

import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pipeline.contract.records import AttemptRecord, StopReason, StopRecord
from pipeline.job import derived
from pipeline.measure.stats import StepStats
from pipeline.tracking import keys as K


def test_derived_imports_no_torch() -> None:
    code = "import sys, pipeline.job.derived, pipeline.contract.records; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("signal", "timeout_drill", "elapsed", "reason"),
    [
        ("SIGTERM", True, 599.0, StopReason.TERMINATED),  # SIGTERM wins over everything
        ("SIGUSR2", True, 1.0, StopReason.TIMEOUT),  # the timeout drill: always a time-out
        ("SIGUSR2", False, 480.0, StopReason.TIMEOUT),  # 480 s = 0.8 x 600 s: the limit's warning
        ("SIGUSR2", False, 479.0, StopReason.PREEMPT),  # just before 80 % of the limit
    ],
)
def test_stop_reason(signal: str, timeout_drill: bool, elapsed: float, reason: StopReason) -> None:
    assert derived.stop_reason(signal, timeout_drill, elapsed, limit_s=600.0) == reason


@pytest.mark.parametrize(
    ("seen", "agreed"),
    [
        ([("", None), ("SIGUSR2", 10.0)], ("SIGUSR2", 10.0)),  # rank 0 stopped on rank 1's flag
        ([("SIGUSR2", 12.0), ("SIGTERM", 11.0)], ("SIGTERM", 11.0)),  # the earliest
        ([("", None), ("", None)], ("", None)),  # no rank got a signal
    ],
)
def test_the_ranks_agree_on_the_earliest_signal(
    seen: list[tuple[str, float | None]], agreed: tuple[str, float | None]
) -> None:
    assert derived.agreed_signal(seen) == agreed


def test_train_metrics() -> None:
    m = derived.train_metrics(
        10, 512, {1: 5.0, 8: 2.0, 9: 3.0, 10: 4.0}, vocab_size=1000, loss_bound_frac=0.5
    )
    assert m[K.TRAIN_STEPS] == 10 and m[K.TRAIN_TOKENS] == 5120  # 10 steps x 512 tokens
    assert m[K.TRAIN_LOSS_BOUND] == pytest.approx(0.5 * 6.907755279)  # ln(1000) = 6.907755279
    assert m[K.TRAIN_INITIAL_LOSS] == 5.0
    assert m[K.TRAIN_FINAL_LOSS] == pytest.approx(3.0)  # (2 + 3 + 4) / 3
    resumed = derived.train_metrics(10, 512, {9: 3.0, 10: 4.0}, 1000, 0.5)
    assert K.TRAIN_INITIAL_LOSS not in resumed  # this attempt has no first step: absent, never 0


def test_step_metrics() -> None:
    m = derived.step_metrics(StepStats(p50_s=0.5, p95_s=0.8, cv=None, timed_steps=8, excluded_steps=2), 1024)
    assert m[K.PERF_TOKENS_PER_S] == 2048.0  # 1024 tokens / 0.5 s
    assert (m[K.PERF_STEP_P50_S], m[K.PERF_STEP_P95_S], m[K.PERF_TIMED_STEPS]) == (0.5, 0.8, 8)
    assert m[K.PERF_WARMUP_STEPS] == 2 and K.PERF_STEP_CV not in m
    assert derived.step_metrics(None, 1024) == {}


def test_flops_and_mfu() -> None:
    # 1000 tokens/s x 6e9 FLOPs/token over 2 devices = 3e12 FLOP/s per device
    m = derived.flops_metrics(1000.0, 6e9, 8e9, 2, peak_flops=1e13, ceiling_tflops=6.0)
    assert m[K.PERF_ACHIEVED_TFLOPS] == pytest.approx(3.0)
    assert m[K.PERF_MFU] == pytest.approx(0.3)  # 3e12 / 1e13
    assert m[K.PERF_HFU] == pytest.approx(0.4)  # 1000 x 8e9 / 2 = 4e12, / 1e13
    assert m[K.PERF_MFU_VS_CEILING] == pytest.approx(0.5)  # 3 TFLOP/s of a 6 TFLOP/s ceiling
    bare = derived.flops_metrics(1000.0, 6e9, None, 2, peak_flops=None, ceiling_tflops=None)
    assert set(bare) == {K.PERF_ACHIEVED_TFLOPS}  # no peak, no ceiling: no MFU, never a guess


def test_datasheet_peak_only_on_the_partitions_gpu() -> None:
    table = {"bf16": 989.0}
    assert derived.datasheet_peak_flops("cuda", None, table, "bf16") == 989e12
    assert derived.datasheet_peak_flops("cpu", None, table, "bf16") is None
    assert derived.datasheet_peak_flops("cuda", "an A100, not an H100", table, "bf16") is None
    assert derived.datasheet_peak_flops("cuda", None, table, "fp32") is None


def test_memory_metrics() -> None:
    m = derived.memory_metrics({"rss": 2.0, "allocated": 30.0, "reserved": 32.0}, 40.0, 25.0)
    assert m[K.MEM_HEADROOM_FRAC] == pytest.approx(0.25)  # 1 - 30 / 40
    assert m[K.MEM_ESTIMATE_HEADROOM_FRAC] == pytest.approx(0.375)  # 1 - 25 / 40
    assert (m[K.MEM_PEAK_ALLOCATED_GIB], m[K.MEM_PEAK_RESERVED_GIB], m[K.MEM_PEAK_RSS_GIB]) == (
        30.0,
        32.0,
        2.0,
    )
    cpu = derived.memory_metrics({"rss": 10.0}, 40.0, 25.0)
    assert (
        cpu[K.MEM_HEADROOM_FRAC] == pytest.approx(0.75) and K.MEM_PEAK_ALLOCATED_GIB not in cpu
    )  # 1 - 10/40
    assert derived.memory_source({"rss": 1.0}) == "rss"
    assert K.MEM_HEADROOM_FRAC not in derived.memory_metrics({"rss": 10.0}, 0.0, 25.0)  # no capacity


def test_model_states() -> None:
    m = derived.model_states_metrics(3 * 2**30, 2 * 2**30)
    assert m == {K.MEM_STATES_MEASURED_GIB: 3.0, K.MEM_STATES_RATIO: 1.5}
    assert K.MEM_STATES_RATIO not in derived.model_states_metrics(3 * 2**30, 0)


def test_checkpoint_metrics_and_counts() -> None:
    trip = SimpleNamespace(
        save=SimpleNamespace(seconds=2.0, stalled_s=0.5, bytes=4_000_000_000),
        load=SimpleNamespace(seconds=0.0, bytes=4_000_000_000),
        verified=True,
    )
    m = derived.checkpoint_metrics(trip)
    assert m[K.CKPT_SAVE_GBPS] == pytest.approx(2.0)  # 4 GB in 2 s
    assert K.CKPT_LOAD_GBPS not in m  # a load that rounds to 0 s: no rate, never 0 GB/s
    assert (m[K.CKPT_STALL_S], m[K.CKPT_VERIFIED]) == (0.5, 1.0)
    counts = derived.checkpoint_counts(2, 1, 0, [AttemptRecord(saves=3, verified=1), AttemptRecord()])
    assert counts == {K.CKPT_SAVES: 5.0, K.CKPT_VERIFIED_COUNT: 2.0, K.CKPT_FALLBACKS: 0.0}


def test_data_wait_and_evals() -> None:
    # steps 1-2 are warm-up; steps 3 and 4 take 4 s, of which 1 s waiting for batches
    wait = derived.data_wait_frac({1: 1.0, 2: 1.0, 3: 2.0, 4: 2.0}, {1: 9.0, 3: 0.5, 4: 0.5}, warmup=2)
    assert wait == pytest.approx(0.25)
    assert derived.data_wait_frac({1: 1.0}, {}, warmup=2) is None
    m = derived.eval_metrics({0: 5.0, 10: 3.0, 20: 2.5}, 1.5)
    assert m == {K.EVAL_TIME_S: 1.5, K.EVAL_FINAL_LOSS: 2.5, K.EVAL_FIRST_LOSS: 5.0}
    assert derived.eval_metrics({}, 0.0) == {K.EVAL_TIME_S: 0.0}


def test_restart_breakdown() -> None:
    prev = StopRecord("preempt", signal_time=100.0, exit_time=105.0, stop_step=12, saved_step=10)
    marks = {"engine_ready": 120.0, "load_done": 123.0, "first_step_done": 125.0}
    b = derived.breakdown(prev, 110.0, marks, resumed_step=10)
    # 100 -> 105 -> 110 -> 120 -> 123 -> 125: parts 5 + 5 + 10 + 3 + 2 = 25 s; steps 11, 12 lost
    assert (b.signal_to_exit_s, b.exit_to_start_s, b.start_to_ready_s, b.load_s, b.first_step_s) == (
        5,
        5,
        10,
        3,
        2,
    )
    assert b.total_s == 25.0 and b.lost_steps == 2 and b.reason == "preempt"
    assert b.metrics()[K.RESTART_TOTAL_S] == 25.0
    assert b.lost_s({11: 1.0, 12: 3.0, 13: 2.0}) == 4.0  # 2 lost steps x the median 2 s
    assert b.lost_s({}) is None
    skewed = derived.breakdown(StopRecord("timeout", 100.0, 99.5, 10, 10), 110.0, marks, 10)
    assert skewed.signal_to_exit_s == 0.0  # another host's clock half a second behind: clamped


def test_stop_records_are_typed() -> None:
    with pytest.raises(ValueError):
        StopRecord("preempted", 1.0, 2.0, 3, 3)  # a misspelt reason fails where it is made
    kill = StopRecord("peer_failure", 100.0, 0.0, 12, 10, detected_time=112.5, dead_rank=0)
    assert kill.attempt_facts()["failed_after_s"] == 12.5 and kill.writer_rank == 1
    assert "failed_after_s" not in StopRecord("preempt", 1.0, 2.0, 3, 3).attempt_facts()
    assert math.isclose(StopRecord(**kill.as_json()).detected_time, 112.5)
