"""How sure the decision is: each candidate's steady step time with its 95% interval (over its
steps and its repeats), the runs flagged as outliers (kept out of the medians), and per model x
method the winner, the runner-up, the margin and the 95% interval of the ratio of their costs,
with the tie rule and the repeats that would settle a tie (pipeline/measure/steady.py has the
rules; docs/design.md, "The decision and its confidence"). Step-time series are read through
the MLflow API (analysis/runs.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from mlflow.tracking import MlflowClient

from analysis.runs import RunRecord, fetch_histories
from analysis.table import Row
from pipeline.contract.outcome import Outcome, Reason
from pipeline.measure.steady import (
    BOOTSTRAP_DRAWS,
    RatioCI,
    Spread,
    Window,
    cost_draws,
    hampel_outliers,
    ratio_interval,
    repeats_needed,
    run_ratio_draws,
    spread,
    steady_window,
)
from pipeline.tracking import keys as K

MAX_SERIES = 400
"""Step-time series fetched at most (one API call each)."""
SEED = 26  # the bootstrap's generator: the same sweep gives the same report


@dataclass
class Outlier:
    run: RunRecord
    what: str  # "start-up" | "steady step time"
    value: float
    median: float
    cause: str


@dataclass
class CandidateSpread:
    row: Row
    spread: Spread | None = None
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)  # run id -> (start, steps)
    outliers: list[Outlier] = field(default_factory=list)

    def interval_text(self) -> str:
        if self.spread is None:
            return "-"
        lo, hi = self.spread.interval()
        sp = self.spread
        runs = f"{sp.runs} run{'s' if sp.runs > 1 else ''}, {sp.steps} steps"
        return f"{sp.mean_s:.4g} ({lo:.4g}-{hi:.4g}; {runs})"


def _startup(r: RunRecord) -> float | None:
    s, n = r.metric(K.TIME_STARTUP_S), r.metric(K.ATTEMPTS) or 1.0
    return s / n if s is not None else None


def _flag(
    runs: Sequence[RunRecord], values: Sequence[float], what: str, cause: Callable[[float, float], str]
) -> list[Outlier]:
    med = statistics.median(values) if values else 0.0
    return [Outlier(runs[i], what, values[i], med, cause(values[i], med)) for i in hampel_outliers(values)]


def startup_outliers(sweep_runs: Sequence[RunRecord]) -> list[Outlier]:
    """Start-ups far from the others of the same partition (they share nodes and file systems)."""
    out: list[Outlier] = []
    for part in sorted({r.partition for r in sweep_runs}):
        mine = [r for r in sweep_runs if r.partition == part and r.finished and _startup(r) is not None]
        values = [v for r in mine if (v := _startup(r)) is not None]

        def cause(v: float, med: float) -> str:
            if v > med:
                return (
                    "a cold start: a one-time build of DeepSpeed's ops or a cold file and import cache "
                    "on the node (the first point on a node pays it)"
                )
            return "a start-up far faster than its partition's others (a warm cache the rest lacked)"

        out += _flag(mine, values, "start-up", cause)
    return out


def step_outliers(means: dict[str, float], rows: Sequence[Row]) -> list[Outlier]:
    """A run's steady mean step time far from its candidate's other repeats: each run's mean
    over its candidate's median (candidates of 3 repeats or more), judged against those ratios
    over the whole sweep (so a group is large enough to have a spread)."""
    runs: list[RunRecord] = []
    ratios: list[float] = []
    for row in rows:
        have = [r for r in row.runs if r.run_id in means]
        if len(have) >= 3:
            med = statistics.median(means[r.run_id] for r in have)
            runs += have
            ratios += [means[r.run_id] / med for r in have]

    def cause(v: float, med: float) -> str:
        return (
            f"load from other processes on a shared machine (the same configuration ran {v:.2f}x its repeats' median)"
            if v > 1
            else f"a run faster than its repeats ({v:.2f}x their median: the others met load the machine had then)"
        )

    out = _flag(runs, ratios, "steady step time", cause)
    for o in out:  # back to seconds for the report
        o.value, o.median = means[o.run.run_id], means[o.run.run_id] / o.value
    return out


def candidate_spreads(
    client: MlflowClient, rows: Sequence[Row], sweep_runs: Sequence[RunRecord]
) -> dict[str, CandidateSpread]:
    """Each candidate's steady step time over its accepted runs, outliers flagged and left out.
    Each candidate's bootstrap draws from its own generator (SEED): its interval depends on its
    runs alone, not on which other candidates the report holds (`report --sweeps` holds more)."""
    picks = [r for row in rows for r in row.runs if r.accepted and K.PERF_STEP_TIME_S in r.metrics]
    series = fetch_histories(client, picks[:MAX_SERIES], K.PERF_STEP_TIME_S)
    starts = startup_outliers(sweep_runs)
    out: dict[str, CandidateSpread] = {}
    windows: dict[str, Window] = {}
    for row in rows:
        out[row.candidate] = cs = CandidateSpread(row, outliers=[o for o in starts if o.run in row.runs])
        for r in row.runs:
            w = steady_window(series.get(r.run_id, []), int(r.metric(K.PERF_WARMUP_STEPS) or 0))
            if w is not None:
                windows[r.run_id] = w
                cs.windows[r.run_id] = (w.start, len(w.steps))
    slow = step_outliers({i: w.mean_s for i, w in windows.items()}, rows)
    for row in rows:
        cs = out[row.candidate]
        cs.outliers += [o for o in slow if o.run in row.runs]
        left = {o.run.run_id for o in cs.outliers if o.what == "steady step time"}
        kept = [windows[i].steps for i in cs.windows if i not in left]
        cs.spread = spread(kept, BOOTSTRAP_DRAWS, np.random.default_rng(SEED)) if kept else None
    return out


def drop_outliers_from_medians(rows: Sequence[Row], spreads: dict[str, CandidateSpread]) -> None:
    """Recompute a candidate's medians without its outlier runs (step-time outliers: every
    performance figure; start-up outliers: the start-up figures), when a run is left."""
    for row in rows:
        cs = spreads.get(row.candidate)
        if cs is None or not cs.outliers:
            continue
        basis = [r for r in row.runs if r.accepted] or [r for r in row.runs if r.finished]
        for o in cs.outliers:
            keys = (
                [K.TIME_STARTUP_S]
                if o.what == "start-up"
                else [k for k in row.values if k.startswith(K.PERF_PREFIX)]
            )
            left = [r for r in basis if r is not o.run]
            for key in keys:
                values = [v for r in left if (v := r.metric(key)) is not None]
                if values:
                    row.values[key] = statistics.median(values)


def outlier_lines(spreads: dict[str, CandidateSpread]) -> list[str]:
    lines = []
    for cs in spreads.values():
        for o in cs.outliers:
            lines.append(
                f"{o.run.label}: {o.what} {o.value:.4g} s against a median of {o.median:.4g} s (more than "
                f"3 scaled MADs away); likely cause: {o.cause}. Kept out of the candidate's medians and interval."
            )
    return lines


def reason_in_words(row: Row) -> str:
    """Why a candidate cannot be recommended, in words ("missed the target: best 7.30 vs 6.87
    at step 60", "crashed: ...")."""
    why = row.ineligible()
    if why != "no accepted run":
        return why or ""
    failed = [r for r in row.runs if r.outcome == Outcome.FAILED]
    if not failed:
        return f"no accepted run ({row.outcome_text() or 'no run finished'})"
    r = failed[0]
    reason, detail = r.tag(K.TAG_REASON), r.tag(K.TAG_REASON_DETAIL)
    if reason == Reason.TARGET_NOT_REACHED:
        target = r.metric(K.TARGET_EVAL_LOSS)
        curve = row.eval_curve if row.eval_curve_run is r else []
        best = min(curve, key=lambda p: p[1]) if curve else None
        if best is None and r.metric(K.EVAL_FINAL_LOSS) is not None:
            best = (int(r.metric(K.TRAIN_STEPS) or 0), r.metric(K.EVAL_FINAL_LOSS) or 0.0)
        if best is not None and target is not None:
            return f"missed the target: best {best[1]:.2f} vs {target:.2f} at step {best[0]}"
        return "missed the target"
    verb: dict[str, str] = {
        Reason.CRASH: "crashed",
        Reason.OOM: "ran out of memory",
        Reason.DOES_NOT_FIT: "does not fit",
    }
    head = verb.get(reason, reason.replace("_", " ") or "failed")
    return f"{head}: {detail}" if detail else head


@dataclass
class Decision:
    model: str
    method: str
    by: str
    order: list[Row]
    value: Callable[[Row], float | None]
    ci: RatioCI | None = None
    ci_note: str = ""
    repeats: int = 1
    over_runs: bool = False  # the interval was bootstrapped over runs (else over steps)
    ineligible: list[tuple[Row, str]] = field(default_factory=list)


def _run_level(row: Row, spreads: dict[str, CandidateSpread], rng: np.random.Generator) -> np.ndarray | None:
    """Cost per successful checkpoint over the candidate's finished runs (two or more with a cost),
    outlier runs left out: its run-to-run spread, start-up and saves included."""
    out = {o.run.run_id for o in spreads[row.candidate].outliers} if row.candidate in spreads else set()
    runs = [r for r in row.runs if r.finished and r.run_id not in out and r.metric(K.COST_USD) is not None]
    outputs = [r.metric(K.CKPT_VERIFIED_COUNT) or r.metric(K.CKPT_VERIFIED) or 0.0 for r in runs]
    costs = [r.metric(K.COST_USD) or 0.0 for r in runs]
    if len(runs) < 2 or sum(outputs) <= 0:
        return None
    point = sum(costs) / sum(outputs)
    draws = run_ratio_draws(costs, outputs, BOOTSTRAP_DRAWS, rng)
    # about the ranked value (every finished run, outliers too): the same spread, relative
    return draws * (row.per_checkpoint / point) if row.per_checkpoint and point > 0 else draws


def _draws(
    row: Row, value: float, share: float | None, spreads: dict[str, CandidateSpread], by_runs: bool
) -> np.ndarray | None:
    if by_runs and (runs := _run_level(row, spreads, np.random.default_rng(SEED))) is not None:
        return runs
    cs = spreads.get(row.candidate)
    if cs is None or cs.spread is None:
        return None
    return cost_draws(value, min(max(share if share is not None else 1.0, 0.0), 1.0), cs.spread)


def settle(d: Decision, spreads: dict[str, CandidateSpread], share: Callable[[Row], float | None]) -> None:
    """The ratio runner-up / winner with its interval, from both candidates' draws: over their
    runs when each has two or more with a cost (cost per checkpoint), else over their steps."""
    if len(d.order) < 2:
        return
    win, second = d.order[0], d.order[1]
    a_val, b_val = d.value(win), d.value(second)
    assert a_val is not None and b_val is not None
    by_runs = d.by == "cost per successful checkpoint"
    a = _draws(win, a_val, share(win), spreads, by_runs)
    b = _draws(second, b_val, share(second), spreads, by_runs)
    if a is None or b is None:
        missing = win if a is None else second
        d.ci_note = f"no interval: {missing.candidate} has no step-time series to measure its spread"
        return
    d.ci = ratio_interval(a, b, b_val / a_val if a_val else float("inf"))
    d.over_runs = by_runs and all(
        _run_level(x, spreads, np.random.default_rng(SEED)) is not None for x in (win, second)
    )
    counts = [len([r for r in x.runs if r.accepted]) for x in (win, second)]
    d.repeats = max(1, min(counts))


def decision_text(d: Decision) -> str:
    head = f"{d.model} x {d.method}"
    if not d.order:
        why = "; ".join(f"{r.candidate}: {w}" for r, w in d.ineligible)
        return f"{head}: no candidate can be recommended ({why})."
    win = d.order[0]
    line = f"{head}: {win.candidate} wins on {d.by}, {_money(d.value(win))}"
    if len(d.order) == 1:
        line += "; the only eligible candidate"
    else:
        second = d.order[1]
        line += f"; runner-up {second.candidate} at {_money(d.value(second))}"
        line += "; " + _confidence(d)
    if d.ineligible:
        line += "; not eligible (not ranked): " + "; ".join(f"{r.candidate}: {w}" for r, w in d.ineligible)
    return line + "."


def _money(v: float | None) -> str:
    if v is None:
        return "not defined"
    return f"${v:,.2f}" if v >= 1 else f"${v:.3g}"


def _confidence(d: Decision) -> str:
    if d.ci is None:
        return d.ci_note or "no interval"
    ci = d.ci
    high = f"{ci.high:.3f}" if math.isfinite(ci.high) else "unbounded"
    margin = (
        f"margin {ci.ratio - 1:+.1%} (runner-up / winner {ci.ratio:.3f}, 95% interval {ci.low:.3f}-{high})"
    )
    if not ci.tie:
        return f"{margin}: the winner is cheaper beyond the measured noise ({d.repeats} repeat(s) each)"
    need = repeats_needed(ci, d.repeats, d.over_runs)
    if need is not None:
        more = f"about {need:,} repeats of each would separate them at the observed spread"
    elif ci.ratio == 1:
        more = "no number of repeats separates two equal costs"
    else:
        more = "the repeats that would separate them are not estimated (a resample had no output)"
        if math.isfinite(ci.se_log):
            more = "the repeats that would separate them are past 100,000"
    return f"{margin}: tie within the measured noise; {more}"


def _step_share(r: Row) -> float | None:
    """The share of a candidate's total cost that scales with its step time: compute / total x
    productive / allocated time (the rest: start-up, saves, storage, fixed charges)."""
    if r.cost is None or not r.cost.total or r.goodput is None or r.goodput.goodput is None:
        return None
    return max(0.0, min(1.0, r.cost.compute / r.cost.total)) * r.goodput.goodput


def _measures(
    projected: dict[str, tuple[float, float]] | None,
) -> tuple[str, Callable[[Row], float | None], Callable[[Row], float | None]]:
    """What the candidates are ranked by, its value and the share of it that scales with step time."""
    if projected is None:
        return (
            "cost per successful checkpoint",
            lambda r: r.per_checkpoint,
            _step_share,
        )
    proj = projected
    return (
        "projected cost to the target run",
        lambda r: proj[r.candidate][0] if r.candidate in proj else None,
        lambda r: proj[r.candidate][1] if r.candidate in proj else None,
    )


def decide(
    rows: Sequence[Row],
    spreads: dict[str, CandidateSpread],
    projected: dict[str, tuple[float, float]] | None = None,
    apart: dict[str, str] | None = None,
) -> list[Decision]:
    """Per model x method: the eligible candidates ranked by projected cost to the target run
    (`projected`: candidate -> (cost, effective training share)) when given, else by cost per
    successful checkpoint (its step-time share: _step_share); the ineligible ones apart, with
    their reason in words, and so are the candidates in `apart` (candidate -> why: the
    production run's deadline they miss)."""
    by, value, share = _measures(projected)
    missing = "not projected" if projected is not None else "no verified checkpoint"
    apart = apart or {}
    out = []
    for model, method in sorted({(r.model, r.method) for r in rows}):
        mine = [r for r in rows if r.model == model and r.method == method]
        ok = [r for r in mine if r.ineligible() is None]
        bad = [(r, reason_in_words(r)) for r in mine if r.ineligible() is not None]
        bad += [(r, apart[r.candidate]) for r in ok if r.candidate in apart]
        ok = [r for r in ok if r.candidate not in apart]
        bad += [(r, missing) for r in ok if value(r) is None]
        ok = sorted((r for r in ok if value(r) is not None), key=lambda r: value(r) or 0.0)
        d = Decision(model, method, by, ok, value, ineligible=bad)
        settle(d, spreads, share)
        out.append(d)
    return out
