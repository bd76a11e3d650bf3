"""Each value the launch files derive (pipeline/measure/launch.py) against a hand computation."""

from __future__ import annotations

import math

import pytest

from pipeline.measure import launch as L
from pipeline.measure.projection import young_daly_interval_s


def test_accumulation_for_a_global_batch() -> None:
    # 512 sequences on 64 GPUs with micro-batch 4 proven: 512 / (4 x 64) = 2 micro-steps
    shape = L.batch_shape(512, 4, 64)
    assert shape == L.BatchShape(micro_batch=4, grad_accum=2, gpus=64)
    assert shape.global_batch == 512
    # 96 on 8 GPUs with 5 proven: 96/8 = 12 per GPU; 5 does not divide 12, 4 does: 4 x 3
    assert L.batch_shape(96, 5, 8) == L.BatchShape(4, 3, 8)
    # fewer sequences than GPUs x 1, or not a multiple of the GPUs: unreachable
    assert L.batch_shape(32, 4, 64) is None
    assert L.batch_shape(100, 4, 64) is None


def test_steps_and_step_time_at_the_target() -> None:
    # 1e9 tokens, 256 x 2048 tokens a step = 524,288: 1e9 / 524288 = 1907.3 -> 1908 steps
    assert L.steps_for_tokens(1e9, 256, 2048) == 1908
    # 256 x 2048 tokens at 3000 tokens/s per GPU on 64 GPUs: 524288 / 192000 = 2.7307 s
    assert L.step_s_at(256, 2048, 3000.0, 64) == pytest.approx(2.730666, rel=1e-5)


def test_checkpoint_interval_in_steps() -> None:
    # C = 30 s stall, 64 GPUs at 2e-5 /GPU-h: lambda = 1.28e-3 /h, M = 781.25 h = 2,812,500 s;
    # Young: sqrt(2 x 30 x 2812500) = 12,990.4 s; at 2.730666 s a step: 4757.2 -> 4757 steps
    tau = young_daly_interval_s(30.0, 1 / (2e-5 * 64 / 3600))
    assert tau == pytest.approx(12990.38, rel=1e-5)
    assert L.checkpoint_every_steps(tau, 524288 / 192000, 100_000) == 4757
    assert L.checkpoint_every_steps(tau, 2.730666, 1000) == 1000  # capped at the run
    assert L.checkpoint_every_steps(None, 2.0, 20) == 20  # nothing interrupts: once, at the end
    assert L.checkpoint_every_steps(0.1, 2.0, 20) == 1  # at least every step


def test_signal_grace() -> None:
    # 2 x (2.73 s step + 40 s save) = 85.46 s -> 2 whole minutes = 120 s
    assert L.signal_grace_s(2.73, 40.0) == 120
    # 2 x (0.05 + 0.2) = 0.5 s -> one minute, Slurm's resolution
    assert L.signal_grace_s(0.05, 0.2) == 60
    # exactly 3 minutes: 2 x (30 + 60) = 180 s -> 180
    assert L.signal_grace_s(30.0, 60.0) == 180


def test_time_limit_under_max_time() -> None:
    # 10 h projected: 36000 x 1.2 = 43200 s, + 120 s grace = 43320 s = 722 min (exact)
    lim = L.time_limit(36000.0, 300.0, 120, max_time_min=2880)
    assert lim == L.TimeLimit(minutes=722, jobs=1, need_s=43200.0)
    # 100 s: 120 + 60 = 180 s -> 3 min; no MaxTime
    assert L.time_limit(100.0, 10.0, 60, None) == L.TimeLimit(3, 1, 120.0)


def test_time_limit_past_max_time_is_a_chain() -> None:
    # 40 h projected: 144000 x 1.2 = 172800 s; MaxTime 24 h = 86400 s, grace 120: 86280 s each
    # can train; later jobs restart for 600 s first: 1 + ceil((172800 - 86280) / (86280 - 600))
    # = 1 + ceil(86520 / 85680) = 1 + 2 = 3 allocations of 1440 min
    lim = L.time_limit(144000.0, 600.0, 120, max_time_min=1440)
    assert lim == L.TimeLimit(minutes=1440, jobs=3, need_s=172800.0)
    assert lim.jobs == 1 + math.ceil((172800 - 86280) / (86280 - 600))
    # a restart longer than what an allocation can train: never finishes
    assert L.time_limit(144000.0, 90000.0, 120, max_time_min=1440) is None
    assert L.time_limit(math.inf, 1.0, 60, 10) is None


def test_restarts_allowed() -> None:
    # 3 allocations (2 requeues), 0.7 interruptions expected -> 2 + ceil(1.4) + 3 = 7
    assert L.restarts_allowed(3, 0.7) == 7
    assert L.restarts_allowed(1, 0.0) == 3
