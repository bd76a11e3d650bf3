"""The qualification report: one row per candidate, references, cost per accepted output and a
recommendation per model; `report_main` is `make report`.

A candidate is partition x model x precision x parallelism (tag sq.candidate); it may have
several runs (drills, repeats). Performance columns are medians over its accepted runs
(over its finished runs when none was accepted); cost columns add up every finished run,
accepted or not (DESIGN "Cost"), with pipeline.cost's functions. Rendering and plots are in
analysis/plots.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from analysis import plots
from analysis.references import (
    References,
    RefResult,
    check_keys,
    judge,
    judge_run,
    load_references,
    verdict,
    write_tags,
)
from analysis.runs import RunRecord, Sweep, SweepNotFound, fetch_histories, load_sweep
from pipeline import keys as K
from pipeline.compose import PROJECT_ROOT
from pipeline.cost import (
    Attempt,
    BadputParts,
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
from pipeline.tracking import default_tracking_uri

DEFAULT_REFERENCES = PROJECT_ROOT / "conf" / "references" / "default.yaml"
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

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.runs)

    @property
    def accepted(self) -> int:
        return self.outcomes[K.OUTCOME_ACCEPTED]

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
            r.tag(K.TAG_REASON) or "no reason" for r in self.runs if r.outcome == K.OUTCOME_FAILED
        )
        parts = []
        for outcome, n in sorted(self.outcomes.items()):
            why = ", ".join(f"{w} x{c}" if c > 1 else w for w, c in sorted(reasons.items()))
            parts.append(f"{n} {outcome}" + (f" ({why})" if outcome == K.OUTCOME_FAILED else ""))
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
    time and price with pipeline.cost.run_cost, else None (unknown)."""
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
        )
    if r.tag(K.TAG_REASON) == K.REASON_DOES_NOT_FIT and r.metric(K.TIME_ALLOCATED_S) is None:
        return CostBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # predicted, never submitted
    allocated, gpus, price, params = r.metric(K.TIME_ALLOCATED_S), r.gpus(), r.price(), r.cost_params()
    if allocated is None or gpus is None or price is None or params is None:
        return None
    ckpt = int(r.metric(K.CKPT_BYTES) or 0)
    problems.append(
        f"{r.label} logged no {K.COST_USD}: cost recomputed from {K.TIME_ALLOCATED_S} as one attempt"
    )
    return run_cost([Attempt(gpus, allocated)], price, params, ckpt, 0)


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


def _num(v: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _usd(row: Row, value: float | None, undefined: str) -> str:
    if value is None:
        return f"not defined ({row.why_undefined(undefined)})"
    amount = f"${value:,.2f}" if value >= 1 else f"${value:.3g}"  # CPU runs here cost fractions of a cent
    return ("≥ " if row.cost_note.startswith("lower bound") else "") + amount


def _price(p: Price | None, source: bool = True) -> str:
    if p is None:
        return "no price"
    return f"${p.usd_per_gpu_hour:.2f}/GPU-h ({p.date}{', ' + p.source if source else ''})"


def _refs_text(row: Row) -> str:
    if not row.refs:
        return "no references"
    fails = [f"{r.metric}: {r.reason}" for r in row.refs if not r.ok]
    return "pass" if not fails else "fail: " + "; ".join(fails)


def candidate_table(rows: Sequence[Row]) -> plots.Table:
    header = [
        "candidate", "runs", "tokens/s", "MFU", "MFU vs ceiling", "step-time CV", "peak mem GiB (headroom)",
        "all-reduce busbw GB/s", "ckpt save / load s", "restart s", "goodput", "total cost",
        "cost per finished run", "cost per successful checkpoint", "tokens per USD", "price", "references",
    ]  # fmt: skip
    body = []
    for r in rows:
        peak = r.value(K.MEM_PEAK_ALLOCATED_GIB) or r.value(K.MEM_PEAK_RSS_GIB)
        head = r.value(K.MEM_HEADROOM_FRAC)
        body.append([
            r.candidate, r.outcome_text(), _num(r.value(K.PERF_TOKENS_PER_S), ",.0f"), _num(r.value(K.PERF_MFU), ".1%"),
            _num(r.value(K.PERF_MFU_VS_CEILING), ".1%"), _num(r.value(K.PERF_STEP_CV), ".3f"),
            f"{_num(peak, '.1f')} ({_num(head, '.0%')})", _num(r.value(K.COMM_ALLREDUCE_BUSBW), ".1f"),
            f"{_num(r.value(K.CKPT_SAVE_S))} / {_num(r.value(K.CKPT_LOAD_S))}",
            _num(r.value(K.RESTART_TOTAL_S), ".1f"), _num(r.goodput.goodput if r.goodput else None, ".1%"),
            _usd(r, r.cost.total if r.cost else None, "no cost"),
            _usd(r, r.per_finished_run, "0 accepted runs"), _usd(r, r.per_checkpoint, "0 verified checkpoints"),
            _num(r.tokens_per_usd, ",.0f"), _price(r.price, source=False), _refs_text(r),
        ])  # fmt: skip
    return plots.Table(header, body)


def recommendation_list(rows: Sequence[Row]) -> list[str]:
    out = []
    for model, (best, why) in recommend(rows).items():
        if best is None:
            out.append(f"{model}: no candidate can be recommended. {why}")
            continue
        out.append(
            f"{model}: {best.candidate}, {_usd(best, best.per_checkpoint, '0 verified checkpoints')} per "
            f"successful checkpoint, {_usd(best, best.per_finished_run, '0 accepted runs')} per finished run at "
            f"{_price(best.price)}; {why}"
        )
    return out


DEFINITIONS = (
    "Performance columns are medians over a candidate's accepted runs (finished runs when none was accepted). "
    "Total cost adds up every finished run, accepted or failed, over all its attempts. Cost per finished run = "
    "total cost / accepted runs; cost per successful checkpoint = total cost / checkpoints that passed restore "
    "verification; tokens per USD = tokens of accepted runs / total cost (DESIGN.md). 'not defined' means the "
    "denominator is zero or there is no price: never 0."
)


def _header(sweep: Sweep, uri: str, refs: References) -> str:
    return (
        f"Sweep {sweep.sweep_id}: {len(sweep.runs)} runs in {len(sweep.by_candidate())} candidates; parent run "
        f"{sweep.parent.run_id} in experiment {sweep.experiment_id} at {uri}; references from {refs.source}; "
        f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}."
    )


def report_sections(
    sweep: Sweep, rows: list[Row], refs: References, uri: str, notes: list[str]
) -> list[plots.Section]:
    """notes[0] says which step-time series were fetched, the rest go to the summary."""
    prices = {(r.partition, _price(r.price)) for r in rows}
    labels = {r.run_id: r.label for r in sweep.runs}
    failing = [
        f"{labels[i]}: {res.metric}: {res.reason}"
        for row in rows
        for i, results in row.run_refs.items()
        for res in results
        if not res.ok
    ]
    ref_rows = [
        [r.candidate, r.verdict or "not judged", _refs_text(r), _counts(r.run_verdicts)] for r in rows
    ]
    problems = sweep.problems + refs.problems
    return [
        plots.Section("Summary", [_header(sweep, uri, refs), *notes[1:], DEFINITIONS]),
        plots.Section("Recommendation (cheapest passing candidate per model)", [recommendation_list(rows)]),
        plots.Section("Candidates", [candidate_table(rows)]),
        plots.Section(
            "Prices (dated snapshots)", [plots.Table(["partition", "price"], sorted(map(list, prices)))]
        ),
        plots.Section(
            "References",
            [
                plots.Table(["candidate", "verdict", "reasons (candidate medians)", "runs"], ref_rows),
                *(
                    [
                        failing[:50]
                        + ([f"... and {len(failing) - 50} more failing checks"] if len(failing) > 50 else [])
                    ]
                    if failing
                    else ["Every judged run passed its references."]
                ),
            ],
        ),  # fmt: skip
        plots.Section("Plots", list(plots.all_plots(rows, notes[0] if notes else ""))),
        plots.Section(
            "Problems", [problems] if problems else ["None: every run had the data the report uses."]
        ),
    ]


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "-"


COMPARE = (
    ("tokens/s", lambda r: r.value(K.PERF_TOKENS_PER_S)),
    ("MFU", lambda r: r.value(K.PERF_MFU)),
    ("step-time CV", lambda r: r.value(K.PERF_STEP_CV)),
    ("goodput", lambda r: r.goodput.goodput if r.goodput else None),
    ("cost per successful checkpoint", lambda r: r.per_checkpoint),
    ("cost per finished run", lambda r: r.per_finished_run),
)


def _delta(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return f"{_num(a)} -> {_num(b)}"
    rel = f" ({(b - a) / abs(a):+.1%})" if a else ""
    return f"{a:.4g} -> {b:.4g}{rel}"


def compare_sections(a: Sweep, b: Sweep, rows_a: list[Row], rows_b: list[Row]) -> list[plots.Section]:
    ra, rb = {r.candidate: r for r in rows_a}, {r.candidate: r for r in rows_b}
    names = sorted(ra.keys() | rb.keys())
    body = []
    for n in names:
        x, y = ra.get(n), rb.get(n)
        cells = [_delta(get(x) if x else None, get(y) if y else None) for _, get in COMPARE]
        verdicts = f"{(x.verdict or 'not judged') if x else 'absent'} -> {(y.verdict or 'not judged') if y else 'absent'}"
        body.append([n, *cells, verdicts])
    figs = [
        plots.compare(f"compare_{i}", f"{label}: A vs B", [(n, get(ra[n]) if n in ra else None,
                      get(rb[n]) if n in rb else None) for n in names], label)
        for i, (label, get) in enumerate(COMPARE) if label in ("tokens/s", "cost per successful checkpoint")
    ]  # fmt: skip
    problems = [f"A: {p}" for p in a.problems] + [f"B: {p}" for p in b.problems]
    return [
        plots.Section("Sweeps", [f"A = {a.sweep_id} (parent {a.parent.run_id}); B = {b.sweep_id} (parent {b.parent.run_id})."]),
        plots.Section("Deltas per candidate (A -> B)", [plots.Table(["candidate", *[c for c, _ in COMPARE], "verdict"], body)]),
        plots.Section("Recommendation in each sweep", [[f"A: {x}" for x in recommendation_list(rows_a)] + [f"B: {x}" for x in recommendation_list(rows_b)]]),
        plots.Section("Plots", list(figs)),
        plots.Section("Problems", [problems] if problems else ["None."]),
    ]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qualify report", description="Decision record of a sweep: HTML + Markdown."
    )
    p.add_argument("--sweep", default=None, help="sweep id (default: the latest parent run)")
    p.add_argument(
        "--compare", metavar="ID2", default=None, help="compare with this sweep: deltas per candidate"
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/<sweep_id>/report/)")
    p.add_argument(
        "--tracking-uri", default=None, help="default: env MLFLOW_TRACKING_URI, else the project's SQLite"
    )
    p.add_argument("--experiment", default="slurm-qualify", help="MLflow experiment name")
    p.add_argument(
        "--references", type=Path, default=DEFAULT_REFERENCES, help="references YAML (conf/references/)"
    )
    p.add_argument(
        "--histories", type=int, default=HISTORY_MAX_RUNS, help="step-time series to fetch at most (0: none)"
    )
    p.add_argument(
        "--no-tag-runs", dest="tag_runs", action="store_false", help="do not set sq.ref.* / sq.verdict tags"
    )
    p.add_argument(
        "--no-attach", dest="attach", action="store_false", help="do not log the pages to the parent run"
    )
    return p


def report_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    uri = args.tracking_uri or default_tracking_uri()
    client = MlflowClient(tracking_uri=uri)
    try:
        sweep = load_sweep(client, args.experiment, args.sweep)
        other = load_sweep(client, args.experiment, args.compare) if args.compare else None
    except (SweepNotFound, MlflowException) as e:
        print(f"report: cannot read the sweep from {uri}: {e}", file=sys.stderr)
        return 2
    refs = load_references(args.references)
    rows = build_rows(sweep, refs)
    notes = [attach_step_times(client, rows, args.histories)]
    if other is not None:
        stem, title = (
            f"compare-{other.sweep_id}",
            f"slurm-qualify: sweep {sweep.sweep_id} vs {other.sweep_id}",
        )
        sections = compare_sections(sweep, other, rows, build_rows(other, load_references(args.references)))
    else:
        if args.tag_runs:
            by_id = {r.run_id: r for r in sweep.runs}
            judged = [(by_id[i], res) for row in rows for i, res in row.run_refs.items()]
            try:
                notes.append(
                    f"reference tags written on {write_tags(client, judged)} of {len(judged)} finished runs"
                )
            except MlflowException as e:
                sweep.problems.append(f"could not write the reference tags on the runs: {e}")
        stem, title = "report", f"slurm-qualify report: sweep {sweep.sweep_id}"
        sections = report_sections(sweep, rows, refs, uri, notes)
    out = args.out or PROJECT_ROOT / "runs" / sweep.sweep_id / "report"
    paths = plots.write_pages(out, stem, title, sections)
    print(f"report: wrote {paths[0]} and {paths[1]}")
    if not args.attach:
        return 0
    try:
        for path in paths:
            if path.is_dir():
                client.log_artifacts(sweep.parent.run_id, str(path), artifact_path=f"report/{path.name}")
            else:
                client.log_artifact(sweep.parent.run_id, str(path), artifact_path="report")
    except (MlflowException, OSError) as e:
        print(f"report: could not attach the pages to run {sweep.parent.run_id}: {e}", file=sys.stderr)
        return 1
    print(f"report: attached to run {sweep.parent.run_id} (artifacts report/)")
    return 0


if __name__ == "__main__":
    sys.exit(report_main(sys.argv[1:]))
