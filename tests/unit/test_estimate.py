"""What a sweep will cost before it runs: the estimate by hand, printed by show/fit/sweep, and
a sweep over its budget refused with exit 2 before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.compose import compose_sweep
from pipeline.contract.outcome import Outcome
from pipeline.submit import estimate as E


def test_step_time_and_point_wall_by_hand() -> None:
    (p,) = compose_sweep("default", ["precision=fp32", "parallelism=zero1"])
    cfg = p.cfg
    # tiny: 638,976 model FLOPs per token (tests/unit/test_flops.py checks it against FlopCounterMode);
    # 4 sequences x 64 tokens x 2 ranks per step, at 0.0134 TFLOP/s per CPU rank
    step = 638_976 * (4 * 64 * 2) / (2 * 0.0134e12)
    assert E.step_time_s(cfg) == pytest.approx(step, rel=1e-12)
    wall, predicted = E.point_wall_s(cfg, local=True)
    assert predicted and wall == pytest.approx(15.0 + 20 * step)  # checkpoint drill: no restart


def test_an_interrupting_drill_adds_a_restart_and_the_reference_replay() -> None:
    (p,) = compose_sweep("default", ["precision=fp32", "parallelism=zero1", "drill=preempt"])
    step = E.step_time_s(p.cfg)
    assert step is not None
    wall, _ = E.point_wall_s(p.cfg, local=True)
    assert wall == pytest.approx(2 * (15.0 + 20 * step) + 15.0)


def test_a_paced_timeout_drill_charges_its_run_the_floor_and_its_replay_the_step() -> None:
    (p,) = compose_sweep(
        "default", ["precision=fp32", "parallelism=zero1", "drill=timeout", "drill.timeout.step_floor_s=0.5"]
    )
    step = E.step_time_s(p.cfg)
    assert step is not None and step < 0.5
    wall, _ = E.point_wall_s(p.cfg, local=True)
    assert wall == pytest.approx((15.0 + 20 * 0.5) + (15.0 + 20 * step) + 15.0)


def test_a_gpu_partition_uses_its_peak_at_the_stated_efficiency() -> None:
    (p,) = compose_sweep("default", ["precision=bf16", "parallelism=zero1", "partition=h100"])
    peak = p.cfg.partition.peak_tflops["bf16"]
    ranks = p.cfg.parallelism.world_size
    tokens = p.cfg.parallelism.micro_batch * p.cfg.parallelism.grad_accum * p.cfg.model.seq_len * ranks
    assert E.step_time_s(p.cfg) == pytest.approx(638_976 * tokens / (ranks * peak * 0.40 * 1e12))
    est = E.estimate([p])
    wall, _ = E.point_wall_s(p.cfg, local=False)
    assert not est.local and est.gpu_hours == pytest.approx(wall * ranks / 3600)
    assert est.usd == pytest.approx(est.gpu_hours * p.cfg.partition.price_usd_per_gpu_hour)


def test_show_prints_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    assert main(["show", "--sweep", "default"]) == 0
    out = capsys.readouterr().out
    assert "estimate: 6 points" in out and "rank-hours" in out and "min on this machine" in out


def test_a_large_sweep_warns() -> None:
    points = compose_sweep("default", ["model=tiny", "train.seed=1,2,3", "train.steps=40000"])
    text = E.describe(E.estimate(points))
    assert "warning: a large qualification" in text


@pytest.mark.parametrize("budget", ["sweep.budget_usd=0.0001", "sweep.budget_gpu_hours=0.001"])
def test_a_sweep_over_its_budget_is_refused_before_anything_is_written(
    budget: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    runs = tmp_path / "runs"
    assert main(["sweep", "--sweep", "default", budget, f"runs_dir={runs}"]) == 2
    err = capsys.readouterr().err
    assert "over its budget" in err and "nothing was submitted" in err
    assert not runs.exists()


@pytest.mark.parametrize(
    "bad", ["sweep.budget_usd=-1", "sweep.budget_usd=0", "sweep.budget_usd=nan", "sweep.budget_gpu_hours=abc"]
)
def test_a_bad_budget_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    assert main(["show", "--sweep", "default", bad]) == 2
    assert "sweep.budget" in capsys.readouterr().err


def test_a_baseline_of_earlier_runs_times_the_point_by_hand() -> None:
    runs = [("c", 130.0, 20, 0.5), ("c", 150.0, 20, 1.0), ("c", 200.0, 20, 0.6), ("d", 10.0, 100, 1.0)]
    b = E.baselines_from(runs)
    # fixed parts 120, 130, 188 -> 130; step times 0.5, 1.0, 0.6 -> 0.6; d: 10 - 100 < 0 -> 0
    assert b["c"] == E.Baseline(130.0, 0.6, 3) and b["d"] == E.Baseline(0.0, 1.0, 1)


def test_the_estimate_reads_earlier_runs_of_the_candidate_from_the_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from pipeline.config.resolved import candidate_name
    from pipeline.tracking import keys as K

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    (p,) = compose_sweep("default", ["precision=fp32", "parallelism=zero1", f"tracking.uri={uri}"])
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("slurm-qualify", artifact_location=(tmp_path / "a").as_uri())
    for allocated, p50 in ((100.0, 0.5), (140.0, 1.5)):
        tags = {
            K.TAG_PARENT_KIND: "point",
            K.TAG_OUTCOME: Outcome.ACCEPTED,
            K.TAG_CANDIDATE: candidate_name(p.cfg),
        }
        run = client.create_run(exp, tags=tags)
        for key, v in ((K.TIME_ALLOCATED_S, allocated), (K.TRAIN_STEPS, 20.0), (K.PERF_STEP_P50_S, p50)):
            client.log_metric(run.info.run_id, key, v)
    base = E.load_baselines([p])
    # fixed parts 90 and 110 -> 100; step times 0.5 and 1.5 -> 1.0
    assert base == {candidate_name(p.cfg): E.Baseline(100.0, 1.0, 2)}
    est = E.estimate([p], base)
    assert est.from_baseline == 1 and est.wall_s == pytest.approx(100.0 + 20 * 1.0)
    assert "1 of 1 point(s) timed from their candidate's earlier runs" in E.describe(est)
    assert E.load_baselines(compose_sweep("default", ["precision=fp32", "parallelism=zero1"])[:0]) == {}
