"""Candidates projected to a production run from what their runs measured."""

from __future__ import annotations

import pytest

from analysis.projection import parse_target, project_candidate
from analysis.runs import RunRecord
from pipeline.contract.outcome import Outcome
from pipeline.tracking import keys as K


def run(
    tps: float,
    gpus: int,
    save_s: float,
    startup_s: float,
    attempts: int,
    restart: float | None = None,
    stall_s: float | None = None,
    **params: str,
) -> RunRecord:
    metrics = {
        K.PERF_TOKENS_PER_S: tps,
        K.CKPT_SAVE_S: save_s,
        K.CKPT_LOAD_S: 0.5,
        K.TIME_STARTUP_S: startup_s,
        K.ATTEMPTS: attempts,
        K.TRAIN_TOKENS: 4096.0 * 20,
        K.TRAIN_STEPS: 20.0,
    }
    if restart is not None:
        metrics[K.RESTART_TOTAL_S] = restart
    if stall_s is not None:
        metrics[K.CKPT_STALL_S] = stall_s
    tags = {K.TAG_OUTCOME: Outcome.ACCEPTED, K.TAG_GPUS: str(gpus)}
    return RunRecord("r", "p", "FINISHED", 0, tags, params, metrics)


def test_parse_target() -> None:
    t = parse_target(["project.tokens=2e10", "project.gpus=64"])
    assert t is not None and t.tokens == 2e10 and t.gpus == 64 and t.steps is None
    assert parse_target([]) is None
    for bad, match in (
        (["project.tokens=2e10"], "project.gpus is required"),
        (["project.gpus=64"], "exactly one of"),
        (["project.tokens=2e10", "project.steps=5", "project.gpus=8"], "exactly one of"),
        (["project.gpus=6.5", "project.tokens=1"], "integer"),
        (["project.tokens=-1", "project.gpus=8"], "positive"),
        (["project.token=1"], "projection keys are"),
        (["tokens=1"], "projection keys are"),
        (["project.tokens=lots", "project.gpus=8"], "must be a number"),
    ):
        with pytest.raises(ValueError, match=match):
            parse_target(bad)


def test_projection_uses_measured_inputs_and_says_where_each_came_from() -> None:
    runs = [run(8000.0, 2, 3.0, 10.0, 2, restart=12.0), run(7600.0, 2, 3.2, 12.0, 2, restart=14.0)]
    target = parse_target(["project.tokens=1e10", "project.gpus=64"])
    assert target is not None
    p = project_candidate("a100/tiny", runs, target, price=2.0)
    assert p.band is not None, p.note
    per_gpu = 7800.0 / 2
    assert p.inputs["tokens_per_s_per_gpu"][0] == pytest.approx(per_gpu)
    assert p.inputs["ckpt_stall_s"][0] == pytest.approx(3.1) and K.CKPT_SAVE_S in p.inputs["ckpt_stall_s"][1]
    assert p.inputs["restart_s"][0] == pytest.approx(13.0) and "measured" in p.inputs["restart_s"][1]
    rate, rate_source = p.inputs["interruptions_per_gpu_hour"]
    assert rate == pytest.approx(419 / (54 * 24 * 16384), rel=1e-12)  # 1.9733e-5: Llama 3's, by hand
    assert "assumed" in rate_source and "Llama 3" in rate_source
    # The middle of the band by hand (Young 1974, Daly 2006 eq. 8), not through the module:
    #   work  = 1e10 tokens / (3900 tokens/s/GPU x 64 GPUs)            = 40064.1026 s
    #   lam   = 1.97328e-5 /GPU-h x 64 / 3600                          = 3.50806e-7 /s
    #   tau   = sqrt(2 x C 3.1 s x M 2850581.38 s)                     = 4203.99864 s
    #   9 full segments of tau + C, then the rest 2228.11479 s + C; start 5.5 s (10/2, 12/2)
    #   E(L)  = (1/lam) e^(lam x R 13 s) (e^(lam L) - 1)
    #   wall  = 5.5 + 9 E(4207.09864) + E(2231.21479)                 = 40129.6139 s
    #   (no interruption at all: 5.5 + 40064.1026 + 10 x 3.1            = 40100.6026 s)
    #   cost  = wall / 3600 x 64 GPUs x $2.00                          = $1426.83
    assert p.mid is not None
    assert p.inputs["work_s"][0] == pytest.approx(40064.10256410256, rel=1e-12)
    assert p.mid.interval_s == pytest.approx(4203.9986420477, rel=1e-9)
    assert p.mid.wall_s == pytest.approx(40129.61390040503, rel=1e-9)
    assert p.mid.cost_usd == pytest.approx(1426.8307164588455, rel=1e-9)
    assert p.mid.gpu_hours == pytest.approx(40129.61390040503 * 64 / 3600, rel=1e-9)


def test_partition_rate_and_estimated_restart() -> None:
    runs = [
        run(
            1000.0,
            4,
            2.0,
            20.0,
            1,
            **{
                "partition.interruptions_per_gpu_hour": "1e-4",
                "partition.interruptions_source": "site logs 2026",
            },
        )
    ]
    target = parse_target(["project.steps=1000", "project.gpus=8"])
    assert target is not None
    p = project_candidate("h100/tiny", runs, target, price=None)
    assert p.inputs["interruptions_per_gpu_hour"] == (1e-4, "partition: site logs 2026")
    assert p.inputs["restart_s"][0] == pytest.approx(20.5) and p.inputs["restart_s"][1].startswith(
        "estimated"
    )
    assert p.inputs["tokens"][0] == pytest.approx(4096.0 * 1000)
    assert p.mid is not None and p.mid.cost_usd is None


def test_no_projection_without_throughput() -> None:
    r = run(1000.0, 2, 1.0, 5.0, 1)
    r.metrics.pop(K.PERF_TOKENS_PER_S)  # type: ignore[attr-defined]
    target = parse_target(["project.tokens=1e9", "project.gpus=8"])
    assert target is not None
    p = project_candidate("x", [r], target, price=1.0)
    assert p.band is None and "throughput" in p.note


def test_the_stall_of_a_background_save_is_preferred_to_its_total() -> None:
    target = parse_target(["project.tokens=1e10", "project.gpus=64"])
    assert target is not None
    runs = [run(8000.0, 2, 3.0, 10.0, 1, stall_s=0.2), run(7600.0, 2, 3.2, 12.0, 1, stall_s=0.4)]
    p = project_candidate("a100/tiny", runs, target, price=2.0)
    value, source = p.inputs["ckpt_stall_s"]
    assert value == pytest.approx(0.3) and K.CKPT_STALL_S in source
    same_without_stall = [run(8000.0, 2, 3.0, 10.0, 1), run(7600.0, 2, 3.2, 12.0, 1)]
    synchronous = project_candidate("a100/tiny", same_without_stall, target, price=2.0)
    assert synchronous.mid is not None and p.mid is not None
    assert p.mid.interval_s < synchronous.mid.interval_s  # a cheaper save: save more often
    assert p.mid.wall_s < synchronous.mid.wall_s


def _warm(r: RunRecord, paid: float | None) -> RunRecord:
    r.tags[K.TAG_RANKS] = "warm"
    if paid is not None:
        r.metrics[K.STARTUP_WARM_IMPORT_S] = paid
    return r


def test_a_warm_start_up_is_never_projected_as_it_is() -> None:
    """Warm local ranks (pipeline/sched/warm.py) start by a fork: their start-up and restart are
    used only with the imports their server paid added back, and said to be estimated; a cold
    run of the candidate, when there is one, is used alone."""
    target = parse_target(["project.tokens=1e10", "project.gpus=64"])
    assert target is not None
    warm = [
        _warm(run(8000.0, 2, 3.0, 4.0, 2, restart=5.0), 7.0),
        _warm(run(8000.0, 2, 3.0, 6.0, 2, restart=7.0), 7.0),
    ]
    p = project_candidate("local/tiny", warm, target, price=2.0)
    start, src = p.inputs["start_s"]
    assert start == pytest.approx((2.0 + 3.0) / 2 + 7.0) and src.startswith("estimated") and "warm" in src
    restart, src = p.inputs["restart_s"]
    assert restart == pytest.approx((5.0 + 7.0) / 2 + 7.0) and src.startswith("estimated")
    # a cold run beside them: only it counts, measured
    mixed = [*warm, run(8000.0, 2, 3.0, 20.0, 2, restart=30.0)]
    p = project_candidate("local/tiny", mixed, target, price=2.0)
    assert p.inputs["start_s"][0] == pytest.approx(10.0) and p.inputs["start_s"][1].startswith("measured")
    assert p.inputs["restart_s"][0] == pytest.approx(30.0) and p.inputs["restart_s"][1].startswith("measured")
    # a warm run that does not say what its server paid has no start-up to project
    p = project_candidate("local/tiny", [_warm(run(8000.0, 2, 3.0, 4.0, 2), None)], target, price=2.0)
    assert "start_s" not in p.inputs and p.band is None
