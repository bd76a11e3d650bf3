"""The decision table: one row per candidate, from its runs as MLflow holds them.

A candidate is partition x model x method x precision x parallelism (tag sq.candidate); it may have
several runs (drills, repeats). Performance columns are medians over its accepted runs
(over its finished runs when none was accepted); cost columns add up every finished run,
accepted or not (docs/design.md, "Cost"), with pipeline.measure.cost's functions. `recommend` picks, per model,
the cheapest candidate that passes; `recommend_by_method` per model x method, and
`method_verdicts` says whether the cheapest full or adapter fine-tune wins. analysis/report.py renders the table.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlflow.tracking import MlflowClient

from analysis.references import References, RefResult, check_keys, judge, judge_run, verdict
from analysis.runs import RunRecord, Sweep, fetch_histories, fetch_series
from pipeline.contract.outcome import Outcome, Reason
from pipeline.measure.cost import (
    BadputParts,
    BilledAttempt,
    CostBreakdown,
    Goodput,
    Price,
    cost_per_finished_run,
    cost_per_successful_checkpoint,
    goodput,
    run_cost,
    sum_costs,
    tokens_per_dollar,
)
from pipeline.tracking import keys as K

RESTART_PARTS = (
    K.RESTART_SIGNAL_TO_EXIT_S,
    K.RESTART_EXIT_TO_START_S,
    K.RESTART_START_TO_READY_S,
    K.RESTART_LOAD_S,
    K.RESTART_FIRST_STEP_S,
)
HISTORY_RUNS_PER_CANDIDATE = 3
HISTORY_MAX_RUNS = 120
"""Step-time histories are one API call per run: a sample of at most this many runs."""


@dataclass
class Row:
    """One candidate's line of the report."""

    candidate: str
    partition: str
    model: str
    precision: str
    parallelism: str
    runs: list[RunRecord]
    price: Price | None = None
    values: dict[str, float | None] = field(default_factory=dict)
    """Median of each metric over the accepted runs (finished runs when none was accepted)."""
    restart_parts: dict[str, float] = field(default_factory=dict)
    goodput: Goodput | None = None
    cost: CostBreakdown | None = None
    cost_note: str = ""
    """Why the cost is not defined, or why it is a lower bound."""
    per_finished_run: float | None = None
    per_checkpoint: float | None = None
    tokens_per_usd: float | None = None
    verified_checkpoints: int = 0
    refs: list[RefResult] = field(default_factory=list)
    """The candidate's medians checked against its references."""
    run_refs: dict[str, list[RefResult]] = field(default_factory=dict)
    """Each finished run (by id) checked against the same references."""
    step_times: list[float] = field(default_factory=list)
    eval_curve: list[tuple[int, float]] = field(default_factory=list)
    """(step, held-out loss) of one of its runs (accepted first): the report's eval curve."""
    eval_curve_run: RunRecord | None = None
    method: str = "full"
    """full | lora | qlora (tag sq.method; runs from before the method axis are full fine-tunes)."""

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.runs)

    @property
    def accepted(self) -> int:
        return self.outcomes[Outcome.ACCEPTED]

    @property
    def verdict(self) -> str | None:
        return verdict(self.refs)

    @property
    def run_verdicts(self) -> Counter[str]:
        return Counter(verdict(results) or "not judged" for results in self.run_refs.values())

    def value(self, key: str) -> float | None:
        return self.values.get(key)

    def outcome_text(self) -> str:
        """E.g. "2 accepted, 2 failed (crash, oom), 1 running"."""
        reasons = Counter(
            r.tag(K.TAG_REASON) or "no reason" for r in self.runs if r.outcome == Outcome.FAILED
        )
        parts = []
        for outcome, n in sorted(self.outcomes.items()):
            why = ", ".join(f"{w} x{c}" if c > 1 else w for w, c in sorted(reasons.items()))
            parts.append(f"{n} {outcome}" + (f" ({why})" if outcome == Outcome.FAILED else ""))
        return ", ".join(parts)

    def why_undefined(self, zero_denominator: str) -> str:
        """Why a cost ratio is not defined: no price or no cost, else its zero denominator."""
        return self.cost_note if self.cost is None else zero_denominator

    def ineligible(self) -> str | None:
        """Why this candidate cannot be recommended; None when it can."""
        if self.accepted == 0:
            return "no accepted run"
        if self.verdict == "fail":
            return "fails its references"
        if self.per_finished_run is None:
            return f"cost not defined ({self.cost_note or 'no cost'})"
        if self.cost_note.startswith("lower bound"):
            return f"cost incomplete ({self.cost_note})"  # a partial sum would flatter it
        return None


def _median(runs: Sequence[RunRecord], key: str) -> float | None:
    values = [v for r in runs if (v := r.metric(key)) is not None]
    return statistics.median(values) if values else None


def _run_cost(r: RunRecord, problems: list[str]) -> CostBreakdown | None:
    """The job's own cost of the run (cost/* metrics), else one recomputed from its allocated
    time and price with pipeline.measure.cost.run_cost, else None (unknown)."""
    total = r.metric(K.COST_USD)
    if total is not None:

        def part(key: str) -> float:
            return r.metric(key) or 0.0

        return CostBreakdown(
            compute=part(K.COST_COMPUTE_USD),
            storage=part(K.COST_STORAGE_USD),
            egress=part(K.COST_EGRESS_USD),
            overhead=part(K.COST_OVERHEAD_USD),
            labor=part(K.COST_LABOR_USD),
            total=total,
            gpu_hours=part(K.COST_GPU_HOURS),
            reusable=part(K.COST_REUSABLE_USD),
        )
    if r.tag(K.TAG_REASON) == Reason.DOES_NOT_FIT and r.metric(K.TIME_ALLOCATED_S) is None:
        return CostBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # predicted, never submitted
    allocated, gpus, price, params = r.metric(K.TIME_ALLOCATED_S), r.gpus(), r.price(), r.cost_params()
    if allocated is None or gpus is None or price is None or params is None:
        return None
    ckpt = int(r.metric(K.CKPT_BYTES) or 0)
    problems.append(
        f"{r.label} logged no {K.COST_USD}: cost recomputed from {K.TIME_ALLOCATED_S} as one attempt"
    )
    return run_cost([BilledAttempt(gpus, allocated)], price, params, ckpt, 0)


def _verified(r: RunRecord) -> float:
    """Checkpoints of the run that passed restore verification (the count, else the flag)."""
    count = r.metric(K.CKPT_VERIFIED_COUNT)
    return count if count is not None else (r.metric(K.CKPT_VERIFIED) or 0.0)


def _cost_columns(row: Row, finished: list[RunRecord], problems: list[str]) -> None:
    prices = {(p.usd_per_gpu_hour, p.date, p.source) for r in row.runs if (p := r.price()) is not None}
    if len(prices) > 1:
        problems.append(
            f"candidate {row.candidate} runs carry {len(prices)} different prices: the first is shown"
        )
    row.price = next((p for r in row.runs if (p := r.price()) is not None), None)
    row.verified_checkpoints = int(sum(_verified(r) for r in finished))
    if row.price is None:
        row.cost_note = "no price"
        return
    costs = [(r, _run_cost(r, problems)) for r in finished]
    known = [c for _, c in costs if c is not None]
    if finished and not known:
        row.cost_note = "no run logged its cost or time"
        return
    row.cost = sum_costs(known)
    if len(known) < len(finished):
        row.cost_note = f"lower bound: {len(finished) - len(known)} run(s) without cost or time"
    total = row.cost.total
    row.per_finished_run = cost_per_finished_run(total, row.accepted)
    row.per_checkpoint = cost_per_successful_checkpoint(total, row.verified_checkpoints)
    tokens = sum(r.metric(K.TRAIN_TOKENS) or 0.0 for r in finished if r.accepted)
    row.tokens_per_usd = tokens_per_dollar(tokens, total)


def _goodput(runs: list[RunRecord], problems: list[str], candidate: str) -> Goodput | None:
    timed = [
        r
        for r in runs
        if r.metric(K.TIME_ALLOCATED_S) is not None and r.metric(K.TIME_PRODUCTIVE_S) is not None
    ]
    if not timed:
        return None

    def total(key: str) -> float:
        return sum(r.metric(key) or 0.0 for r in timed)

    parts = BadputParts(
        startup_s=total(K.TIME_STARTUP_S),
        ckpt_save_s=total(K.TIME_CKPT_SAVE_S),
        restore_s=total(K.TIME_CKPT_LOAD_S),
        lost_work_s=total(K.TIME_LOST_S),
        drills_s=total(K.TIME_DRILLS_S),
    )
    try:
        return goodput(total(K.TIME_PRODUCTIVE_S), total(K.TIME_ALLOCATED_S), parts)
    except ValueError as e:
        problems.append(f"candidate {candidate}: goodput not computed ({e})")
        return None


def build_row(candidate: str, runs: list[RunRecord], refs: References, problems: list[str]) -> Row:
    first = runs[0]
    row = Row(candidate, first.partition, first.model, first.precision, first.parallelism, runs)
    row.method = first.tag(K.TAG_METHOD) or "full"
    finished = [r for r in runs if r.finished]
    basis = [r for r in finished if r.accepted] or finished
    keys = {k for r in basis for k in r.metrics} | refs.metrics()
    row.values = {k: _median(basis, k) for k in keys}
    with_restart = [r for r in basis if r.metric(K.RESTART_TOTAL_S) is not None]
    row.restart_parts = {k: v for k in RESTART_PARTS if (v := _median(with_restart, k)) is not None}
    row.goodput = _goodput(finished, problems, candidate)
    _cost_columns(row, finished, problems)
    applicable = refs.for_run(row.partition, row.model, row.precision, row.parallelism)
    row.refs = judge(applicable, row.value, "not reported by any finished run")
    row.run_refs = {r.run_id: judge_run(refs, r) for r in finished}
    return row


def build_rows(sweep: Sweep, refs: References) -> list[Row]:
    check_keys(refs, sweep.runs)
    return [build_row(c, runs, refs, sweep.problems) for c, runs in sweep.by_candidate().items()]


def recommend(rows: Sequence[Row]) -> dict[str, tuple[Row | None, str]]:
    """Per model, the cheapest eligible candidate: by cost per successful checkpoint, then
    per finished run. With none, the reason of each candidate."""
    out: dict[str, tuple[Row | None, str]] = {}
    for model in sorted({r.model for r in rows}):
        mine = [r for r in rows if r.model == model]
        ok = [r for r in mine if r.ineligible() is None]
        if not ok:
            out[model] = (None, "; ".join(f"{r.candidate}: {r.ineligible()}" for r in mine))
            continue
        inf = float("inf")
        ok.sort(key=lambda r: (r.per_checkpoint is None, r.per_checkpoint or inf, r.per_finished_run or inf))
        best = ok[0]
        by = "cost per successful checkpoint" if best.per_checkpoint is not None else "cost per finished run"
        out[model] = (best, f"cheapest of {len(ok)} passing candidate(s) by {by}")
    return out


def attach_eval_curves(client: MlflowClient, rows: Sequence[Row]) -> str:
    """The eval-loss curve of one run per candidate (an accepted one where there is one)."""
    picks = []
    for row in rows:
        have = [r for r in row.runs if r.finished and K.EVAL_FIRST_LOSS in r.metrics]
        have.sort(key=lambda r: not r.accepted)
        if have:
            picks.append((row, have[0]))
    series = fetch_series(client, [r for _, r in picks], K.EVAL_LOSS)
    for row, run in picks:
        row.eval_curve, row.eval_curve_run = series[run.run_id], run
    return (
        f"eval loss of one run per candidate ({len(picks)} of {len(rows)} candidates evaluated; accepted runs "
        f"first); the dashed line is that run's target ({K.TARGET_EVAL_LOSS})"
    )


def recommend_by_method(rows: Sequence[Row]) -> dict[tuple[str, str], tuple[Row | None, str]]:
    """recommend() for each model x method: the cheapest passing full fine-tune, LoRA, QLoRA."""
    out: dict[tuple[str, str], tuple[Row | None, str]] = {}
    for model, method in sorted({(r.model, r.method) for r in rows}):
        mine = [r for r in rows if r.model == model and r.method == method]
        out[(model, method)] = recommend(mine)[model]
    return out


@dataclass(frozen=True)
class MethodVerdict:
    """For one model: the cheapest passing full fine-tune against the cheapest passing adapter
    fine-tune (LoRA or QLoRA), by cost per successful checkpoint (then per finished run)."""

    model: str
    full: Row | None
    adapter: Row | None

    @property
    def winner(self) -> Row | None:
        """The cheaper of the two; None unless both passed and both costs are defined."""
        if self.full is None or self.adapter is None:
            return None

        def key(r: Row) -> tuple[float, float]:
            inf = float("inf")
            return (r.per_checkpoint if r.per_checkpoint is not None else inf, r.per_finished_run or inf)

        return min((self.full, self.adapter), key=key)


def method_verdicts(rows: Sequence[Row]) -> list[MethodVerdict]:
    """Per model that was run with both a full and an adapter method."""
    best = recommend_by_method(rows)
    out = []
    for model in sorted({r.model for r in rows}):
        methods = {m for (mod, m) in best if mod == model}
        if "full" not in methods or not methods - {"full"}:
            continue
        adapters = [best[(model, m)][0] for m in sorted(methods - {"full"})]
        passing = [r for r in adapters if r is not None]
        cheapest = recommend(passing)[model][0] if passing else None
        out.append(MethodVerdict(model, best[(model, "full")][0], cheapest))
    return out


def attach_step_times(client: MlflowClient, rows: Sequence[Row], max_runs: int) -> str:
    """Step-time series (warm-up dropped) of a sample of at most HISTORY_RUNS_PER_CANDIDATE
    accepted runs per candidate and max_runs in all; returns a note saying what was sampled."""
    queues = [[r for r in row.runs if r.accepted and K.PERF_STEP_TIME_S in r.metrics] for row in rows]
    picks = [
        (row, q[i])
        for i in range(HISTORY_RUNS_PER_CANDIDATE)
        for row, q in zip(rows, queues, strict=True)
        if i < len(q)
    ]
    picks = picks[:max_runs]
    histories = fetch_histories(client, [r for _, r in picks], K.PERF_STEP_TIME_S)
    for row, run in picks:
        row.step_times.extend(histories[run.run_id][int(run.metric(K.PERF_WARMUP_STEPS) or 0) :])
    total = sum(len(q) for q in queues)
    return (
        f"step times of {len(picks)} of {total} accepted runs with a series (at most {HISTORY_RUNS_PER_CANDIDATE} "
        f"per candidate and {max_runs} in all: one API call each), warm-up steps excluded"
    )


def write_candidate_costs(client: Any, rows: list[Row]) -> int:
    """Log each candidate's cost per finished run and per successful checkpoint on every one of
    its runs (`candidate/usd_per_*`), so the MLflow runs table shows them beside each run's own
    figures; a value that is not defined is not logged. Only runs whose value changes are
    written (one log_batch each): a second report on the same sweep writes nothing. Returns the
    number of runs written."""
    import time

    from mlflow.entities import Metric

    written = 0
    now = int(time.time() * 1000)
    for row in rows:
        # to a millionth of a dollar: the UI shows a sum's float noise (6.1899999999999995) as it is
        want = {
            key: None if value is None else round(value, 6)
            for key, value in (
                (K.CAND_USD_PER_FINISHED_RUN, row.per_finished_run),
                (K.CAND_USD_PER_CHECKPOINT, row.per_checkpoint),
            )
        }
        for run in row.runs:
            changed = [
                Metric(key, value, now, 0)
                for key, value in want.items()
                if value is not None and run.metric(key) != value
            ]
            if changed:
                client.log_batch(run.run_id, metrics=changed)
                written += 1
    return written
