"""The decision's confidence end to end: runs logged through the MLflow API with known step-time
noise, read back by analysis/ (candidate intervals, the tie rule, outliers out of the medians),
and the reasons of ineligible candidates in words."""

from __future__ import annotations

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from analysis.confidence import (
    candidate_spreads,
    decide,
    decision_text,
    drop_outliers_from_medians,
    reason_in_words,
)
from analysis.references import References
from analysis.runs import RunRecord, load_sweep
from analysis.table import Row, build_rows
from pipeline.contract.outcome import Outcome, Reason
from pipeline.tracking import keys as K
from tests.support.analysis_helpers import H100_A, TOKENS_PER_STEP, RunSpec, log_run, start_sweep

Z3, Z2 = "zero3-1x4-mb1-ga1-ac", "zero2-1x4-mb1-ga1"


def _sweep(
    uri: str, apart: float, repeats: int, seed: int, startups: list[float] | None = None, slow: int = -1
):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    sweep = start_sweep(uri, f"20261201-1200{seed:02d}-conf")
    client = MlflowClient(tracking_uri=uri)
    t0 = 1_700_000_000_000
    n = 0
    for par, tps in ((Z3, 100.0), (Z2, 100.0 / apart)):  # steps of 164 s: compute dominates
        mean = TOKENS_PER_STEP / tps
        for k in range(repeats):
            steps = tuple(float(x) * (2.0 if n == slow else 1.0) for x in rng.normal(mean, 0.10 * mean, 33))
            start = startups[n] if startups else 60.0
            # the allocation holds the steps (the fake's productive time is 75% of it): cost follows them
            allocated = sum(steps) / 0.75
            spec = RunSpec(
                "h100", parallelism=par, tokens_per_s=tps, steps=33, step_times=steps, startup_s=start,
                allocated_s=allocated,
            )  # fmt: skip
            log_run(client, sweep, spec, f"{par}-{k}", t0 + 1000 * n)
            n += 1
    s = load_sweep(client, "slurm-qualify", sweep.sweep_id)
    rows = build_rows(s, References("none"))
    return client, s, rows


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite store for the module (each sweep has its own id): its schema is made once."""
    return f"sqlite:///{tmp_path_factory.mktemp('confidence') / 'm.db'}"


def _decision(client, s, rows):  # type: ignore[no-untyped-def]
    spreads = candidate_spreads(client, rows, s.runs)
    drop_outliers_from_medians(rows, spreads)
    (d,) = decide(rows, spreads)
    return d, spreads


def test_three_percent_apart_is_a_tie_and_forty_percent_is_not(uri: str) -> None:
    d, spreads = _decision(*_sweep(uri, 1.03, 1, seed=3))
    assert d.ci is not None and d.ci.tie, d.ci
    text = decision_text(d)
    assert "tie within the measured noise" in text and "repeats of each would separate them" in text
    assert (
        spreads[H100_A].interval_text().endswith("1 run, 30 steps)")
        or "1 run" in spreads[H100_A].interval_text()
    )
    d2, _ = _decision(*_sweep(uri, 1.40, 2, seed=4))
    assert d2.ci is not None and not d2.ci.tie and d2.order[0].candidate == H100_A
    assert "beyond the measured noise" in decision_text(d2)
    # the decision's interval holds the true ratio of costs per checkpoint: the step share of
    # the cost scales by 1.40, the rest (start-up, saves) does not
    assert d2.ci.low < d2.ci.ratio < d2.ci.high


def test_a_cold_start_is_flagged_with_its_cause_and_kept_out_of_the_median(uri: str) -> None:
    client, s, rows = _sweep(uri, 1.5, 3, seed=5, startups=[176.0, 18.0, 16.0, 17.0, 19.0, 18.0])
    d, spreads = _decision(client, s, rows)
    flagged = [o for cs in spreads.values() for o in cs.outliers]
    assert len(flagged) == 1 and flagged[0].what == "start-up" and "cold start" in flagged[0].cause
    row = next(r for r in rows if r.candidate == H100_A)
    assert row.value(K.TIME_STARTUP_S) == pytest.approx(17.0)  # median of 18 and 16, not of 176, 18, 16


def _record(**metrics: float) -> RunRecord:
    tags = {K.TAG_OUTCOME: Outcome.FAILED, K.TAG_REASON: Reason.TARGET_NOT_REACHED, K.TAG_CANDIDATE: "x"}
    return RunRecord("r1", "p1", "FINISHED", 0, tags, {}, metrics)


def test_an_ineligible_candidate_says_why_in_words() -> None:
    r = _record(**{K.TARGET_EVAL_LOSS: 6.87, K.EVAL_FINAL_LOSS: 7.41, K.TRAIN_STEPS: 60})
    row = Row("x", "h100", "m", "bf16", "z", [r])
    row.eval_curve, row.eval_curve_run = [(0, 9.1), (40, 7.30), (60, 7.41)], r
    assert reason_in_words(row) == "missed the target: best 7.30 vs 6.87 at step 40"
    row.eval_curve = []
    assert reason_in_words(row) == "missed the target: best 7.41 vs 6.87 at step 60"
    crash = RunRecord(
        "r2", "p2", "FAILED", 0, {K.TAG_OUTCOME: Outcome.FAILED, K.TAG_REASON: Reason.CRASH,
                                  K.TAG_REASON_DETAIL: "NCCL timeout on node gpu07"}, {}, {}
    )  # fmt: skip
    assert (
        reason_in_words(Row("y", "h100", "m", "bf16", "z", [crash])) == "crashed: NCCL timeout on node gpu07"
    )


def test_a_loaded_repeat_is_flagged_and_left_out_of_the_interval(uri: str) -> None:
    client, s, rows = _sweep(
        uri, 1.5, 3, seed=6, slow=1
    )  # the second repeat of the first candidate ran 2x slow
    d, spreads = _decision(client, s, rows)
    flagged = [o for cs in spreads.values() for o in cs.outliers]
    assert [o.what for o in flagged] == ["steady step time"] and flagged[0].run.name.endswith("-1")
    assert "load from other processes" in flagged[0].cause
    sp = spreads[H100_A].spread
    assert sp is not None and sp.runs == 2  # the loaded repeat is out of the interval
    lo, hi = sp.interval()
    assert lo < TOKENS_PER_STEP / 100.0 < hi


def test_a_candidate_put_apart_for_the_deadline_leaves_the_ranking_with_its_reason(uri: str) -> None:
    """The cheaper candidate (Z3 here, 40% apart) misses the production run's deadline: the
    decision ranks the other one alone and names why the first is apart."""
    client, s, rows = _sweep(uri, 1.4, 1, seed=7)
    spreads = candidate_spreads(client, rows, s.runs)
    (before,) = decide(rows, spreads)
    cheapest = before.order[0].candidate
    why = "misses the 12 h deadline (time to result 13.0 h)"
    (d,) = decide(rows, spreads, None, {cheapest: why})
    assert [r.candidate for r in d.order] == [r.candidate for r in before.order[1:]]
    assert (cheapest, why) in [(r.candidate, reason) for r, reason in d.ineligible]


def test_an_unbounded_interval_is_a_tie_in_words() -> None:
    """The decision line of a runner-up with no output in a few of its resampled runs: the
    interval's top is unbounded (said in words, never "nan" or "inf"), so the winner is not
    called cheaper beyond the noise."""
    from analysis.confidence import Decision
    from pipeline.measure.steady import ratio_interval

    rows = [Row(c, "h100", "m", "bf16", "z", []) for c in ("a", "b")]
    b = np.linspace(0.5, 2.9, 100)
    b[-4:] = np.inf
    costs = {"a": 2.46, "b": 4.13}
    d = Decision("m", "full", "cost per successful checkpoint", rows, lambda r: costs[r.candidate])
    d.ci = ratio_interval(np.ones(100), b, 4.13 / 2.46)
    text = decision_text(d)
    assert "-unbounded)" in text and "tie within the measured noise" in text, text
    assert "beyond the measured noise" not in text and "nan" not in text and "inf)" not in text
