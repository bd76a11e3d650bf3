"""The qualification report: the decision table (analysis/table.py) rendered as Markdown and
HTML with the references, cost per accepted output, a recommendation per model and the plots
(analysis/plots.py), attached to the sweep's parent run; `report_main` is `make report`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from analysis import chat, energy, plots, stack, startup, workload
from analysis.adaptive import adaptive_line
from analysis.availability import AskStart, PartitionQueue, availability_section, partition_queues, run_waits
from analysis.confidence import (
    CandidateSpread,
    candidate_spreads,
    decide,
    decision_text,
    drop_outliers_from_medians,
    outlier_lines,
)
from analysis.projection import Target, parse_target, projection_section
from analysis.references import References, load_references, write_tags
from analysis.runs import Sweep, SweepNotFound, fetch_series, load_sweep
from analysis.scaling import scaling_section
from analysis.sweeps import clusters_section, combine
from analysis.table import (
    HISTORY_MAX_RUNS,
    Row,
    attach_eval_curves,
    attach_step_times,
    build_rows,
    method_verdicts,
    recommend,
    recommend_by_method,
    write_candidate_costs,
)
from pipeline.contract.outcome import NEEDS_PERSON
from pipeline.contract.sweepdir import SweepDir
from pipeline.home import RUNS_DIR, conf_dir, is_plain_name, project_home
from pipeline.measure.cost import COST_DEFINITIONS, Price
from pipeline.tracking import keys as K
from pipeline.tracking.store import default_tracking_uri, missing_store

log = logging.getLogger(__name__)


def default_references() -> Path:
    return conf_dir() / "references" / "default.yaml"


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


def candidate_table(rows: Sequence[Row], spreads: dict[str, CandidateSpread] | None = None) -> plots.Table:
    """The columns a decision rests on (one screen); the rest is in details_table."""
    spreads = spreads or {}
    header = [
        "candidate", "runs", "steady step s (95% interval)", "tokens/s", "MFU", "peak mem GiB (headroom)", "cost per successful checkpoint",
        "cost to target", "tokens per USD", "references",
    ]  # fmt: skip
    body = []
    for r in rows:
        peak = r.value(K.MEM_PEAK_ALLOCATED_GIB) or r.value(K.MEM_PEAK_RSS_GIB)
        head = r.value(K.MEM_HEADROOM_FRAC)
        mfu = r.value(K.PERF_MFU)
        body.append([
            r.candidate, r.outcome_text(),
            spreads[r.candidate].interval_text() if r.candidate in spreads else "-",
            _num(r.value(K.PERF_TOKENS_PER_S), ",.0f"),
            _num(mfu, ".1%") if mfu is not None else _num(r.value(K.PERF_MFU_VS_CEILING), ".1%", "*"),
            f"{_num(peak, '.1f')} ({_num(head, '.0%')})",
            _usd(r, r.per_checkpoint, "0 verified checkpoints"), _target_usd(r),
            _num(r.tokens_per_usd, ",.0f"), _refs_text(r),
        ])  # fmt: skip
    return plots.Table(header, body)


def details_table(rows: Sequence[Row]) -> plots.Table:
    header = [
        "candidate", "MFU vs ceiling", "step-time CV", "headroom predicted", "largest micro-batch",
        "all-reduce busbw GB/s", "ckpt save / load s", "restart s", "goodput", "total cost",
        "cost per finished run", "price",
    ]  # fmt: skip
    body = []
    for r in rows:
        body.append([
            r.candidate, _num(r.value(K.PERF_MFU_VS_CEILING), ".1%"), _num(r.value(K.PERF_STEP_CV), ".3f"),
            _num(r.value(K.MEM_ESTIMATE_HEADROOM_FRAC), ".0%"), _num(r.value(K.SEARCH_MICRO_BATCH), ".0f"),
            _num(r.value(K.COMM_ALLREDUCE_BUSBW), ".1f"),
            f"{_num(r.value(K.CKPT_SAVE_S))} / {_num(r.value(K.CKPT_LOAD_S))}",
            _num(r.value(K.RESTART_TOTAL_S), ".1f"), _num(r.goodput.goodput if r.goodput else None, ".1%"),
            _usd(r, r.cost.total if r.cost else None, "no cost"),
            _usd(r, r.per_finished_run, "0 accepted runs"), _price(r.price, source=False),
        ])  # fmt: skip
    return plots.Table(header, body)


def _target_usd(r: Row) -> str:
    """Cost to target; "-" where no run had a target (nothing evaluated)."""
    if r.value(K.TARGET_EVAL_LOSS) is None:
        return "-"
    return _usd(r, r.value(K.TARGET_USD), "target not reached")


def data_table(rows: Sequence[Row]) -> plots.Table:
    """The data path and the quality target per candidate (medians over its accepted runs)."""
    header = [
        "candidate", "data", "eval loss first -> final", "target", "steps to target", "time to target s",
        "GPU-hours to target", "cost to target", "data wait share", "loader tokens/s", "loader MB/s",
    ]  # fmt: skip
    body = []
    for r in rows:
        first, final = r.value(K.EVAL_FIRST_LOSS), r.value(K.EVAL_FINAL_LOSS)
        data = sorted({d for run in r.runs if (d := run.tag(K.TAG_DATA))})
        body.append([
            r.candidate, ", ".join(data) or "-", f"{_num(first, '.3f')} -> {_num(final, '.3f')}",
            _num(r.value(K.TARGET_EVAL_LOSS), ".3f"), _num(r.value(K.TARGET_STEPS), ".0f"),
            _num(r.value(K.TARGET_TIME_S), ".3g"), _num(r.value(K.TARGET_GPU_HOURS), ".3g"),
            _target_usd(r), _num(r.value(K.DATA_WAIT_FRAC), ".1%"),
            _num(r.value(K.DATA_READ_TOKENS_PER_S), ",.0f"), _num(r.value(K.DATA_READ_MB_PER_S), ".3g"),
        ])  # fmt: skip
    return plots.Table(header, body)


DATA_DEFINITIONS = (
    "Steps to target: the first evaluated step whose held-out loss is at or below the target "
    "(accept.target_eval_loss; with accept.relative, that fraction of the loss before the first step). Time to "
    "target = steps to target x median step time (start-up, evaluations, checkpoints and restarts excluded); "
    "GPU-hours = time x ranks / 3600; cost to target = GPU-hours x the dated price. Data wait share = time the "
    "steps waited for their batches / step time, timed steps, slowest rank. Loader tokens/s and MB/s: the run's "
    "DataLoader reading ahead of training, before it (MB/s absent for synthetic data: nothing is read). "
    "data=tokens|text points are accepted on the target; data=synthetic keeps the training-loss bound."
)


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


def method_list(rows: Sequence[Row]) -> list[str]:
    """The cheapest passing candidate of each model x method, with its memory headroom, and for
    each model run both ways whether the full or the adapter fine-tune is cheaper."""
    out = []
    for (model, method), (best, why) in recommend_by_method(rows).items():
        if best is None:
            out.append(f"{model} x {method}: no passing candidate. {why}")
            continue
        out.append(
            f"{model} x {method}: {best.candidate}, {_usd(best, best.per_checkpoint, '0 verified checkpoints')} per "
            f"successful checkpoint, memory headroom {_num(best.value(K.MEM_HEADROOM_FRAC), '.0%')}; {why}"
        )
    for v in method_verdicts(rows):
        win = v.winner
        if win is None:
            missing = "full fine-tune" if v.full is None else "adapter fine-tune"
            out.append(f"{v.model}: full vs adapter not decided: no passing {missing} with a defined cost")
            continue
        assert v.full is not None and v.adapter is not None
        lose = v.adapter if win is v.full else v.full
        out.append(
            f"{v.model}: the {'full' if win is v.full else v.adapter.method} fine-tune wins: {win.candidate} at "
            f"{_usd(win, win.per_checkpoint, '0 verified checkpoints')} per successful checkpoint (headroom "
            f"{_num(win.value(K.MEM_HEADROOM_FRAC), '.0%')}) against {lose.candidate} at "
            f"{_usd(lose, lose.per_checkpoint, '0 verified checkpoints')} (headroom "
            f"{_num(lose.value(K.MEM_HEADROOM_FRAC), '.0%')})"
        )
    return out


DEFINITIONS = (
    "Performance columns are medians over a candidate's accepted runs (finished runs when none was accepted). "
    "Total cost adds up every finished run, accepted or failed, over all its attempts. Cost per finished run = "
    "total cost / accepted runs; cost per successful checkpoint = total cost / checkpoints that passed restore "
    "verification; tokens per USD = tokens of accepted runs / total cost (definitions: docs/design.md, "
    "'The numbers'). 'not defined' means the denominator is zero or there is no price: never 0."
)


_COST_SOURCES = {"compute cost": "partition price_source", "total cost": "docs/design.md 'Cost'"}


def cost_definition(name: str) -> str:
    """A cost part as pipeline.measure.cost computes it; labor names the reasons that need a
    person (pipeline.contract.outcome.NEEDS_PERSON), the only endings it is charged for."""
    text = COST_DEFINITIONS[name]
    if name == "labor cost":
        text += " Charged for: " + ", ".join(str(r) for r in NEEDS_PERSON) + "."
    return text


METRIC_DEFINITIONS: list[list[str]] = [
    [
        "model FLOPs per token",
        "6N + 12·L·H·Q·T: N = weights of every matmul, the output layer included (tied or not), the input "
        "embedding lookup not; attention over the full T×T square (no causal halving). Checked equal to "
        "torch FlopCounterMode over forward + backward of every preset's Hugging Face model (meta device).",
        "PaLM (Chowdhery et al. 2022) app. B; torchtitan get_num_flop_per_token; nanoGPT estimate_mfu",
    ],
    [
        "MFU",
        "model FLOPs per token × tokens/s ÷ devices ÷ the datasheet's dense peak of the precision. Absent "
        "('-') on a CPU, on a GPU that is not the partition's type, or without a peak in the partition config.",
        "PaLM app. B; peaks: the partition config's peak_source",
    ],
    [
        "HFU",
        "as MFU with the FLOPs the hardware executes: + each block's forward again under activation "
        "checkpointing, except what torch's non-reentrant checkpoint skips (llama: the down projection). "
        "Checked against FlopCounterMode with checkpointing on.",
        "Korthikanti et al. 2022 §5",
    ],
    [
        "MFU vs ceiling",
        "achieved model FLOP/s per device ÷ a measured matmul rate on the same device and dtype (on CPU: one "
        "square size, the threads of one rank). A ceiling, not the hardware's maximum: not capped at 1.",
        "pipeline/train/probes.py measure_matmul_tflops",
    ],
    [
        "busbw",
        "bus bandwidth = algbw × 2(n-1)/n (all-reduce) or (n-1)/n (all-gather), the plateau over train.comm_sizes_mb "
        "(16 MB or less by default; nccl-tests plateaus at hundreds of MB to GB, so in-job figures read low).",
        "nccl-tests doc/PERFORMANCE.md",
    ],
    [
        "step-time CV",
        "stdev ÷ mean of the timed steps after warm-up. Absent with one timed step (no spread to measure).",
        "",
    ],
    [
        "memory headroom",
        "1 - peak tensor bytes ÷ capacity, measured (cuda max_memory_allocated; CPU: process RSS) and predicted "
        "(model states + activations + logits, without CUDA context or fragmentation) on that one basis.",
        "Rajbhandari et al. 2020 (ZeRO) for model states",
    ],
    [
        "goodput",
        "productive step time (redone steps excluded) ÷ allocated wall time, over all attempts. Allocated time: "
        "sacct ElapsedRaw of every allocation of the job, requeues included (tag sq.allocated_source=sacct); "
        "the process clock where there is no Slurm (process_clock).",
        "Google Cloud ML goodput; sacct(1)",
    ],
    *[[name, cost_definition(name), _COST_SOURCES.get(name, "cost config")] for name in COST_DEFINITIONS],
]


def _header(sweep: Sweep, uri: str, refs: References) -> str:
    if sweep.parts:
        names = ", ".join(f"{s.sweep_id} (parent run {s.parent.run_id})" for s in sweep.parts)
        return (
            f"Sweeps {names}: {len(sweep.runs)} runs in {len(sweep.by_candidate())} candidates in experiment "
            f"{sweep.experiment_id} at {uri}; references from {refs.source}; generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}."
        )
    return (
        f"Sweep {sweep.sweep_id}: {len(sweep.runs)} runs in {len(sweep.by_candidate())} candidates; parent run "
        f"{sweep.parent.run_id} in experiment {sweep.experiment_id} at {uri}; references from {refs.source}; "
        f"generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')}."
    )


def _reference_section(sweep: Sweep, rows: list[Row]) -> plots.Section:
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
    more = [f"... and {len(failing) - 50} more failing checks"] if len(failing) > 50 else []
    return plots.Section(
        "References",
        [
            plots.Table(["candidate", "verdict", "reasons (candidate medians)", "runs"], ref_rows),
            failing[:50] + more if failing else "Every judged run passed its references.",
        ],
    )


def _decision_sections(
    rows: list[Row],
    spreads: dict[str, CandidateSpread],
    target: Target | None,
    parent: Any = None,
    queues: dict[str, PartitionQueue] | None = None,
    ask: AskStart | None = None,
) -> list[plots.Section]:
    """The decision with its confidence (and the projection it rests on, with a target; and
    the time to result, with the partitions' queues)."""
    projection: list[plots.Section] = []
    projected = None
    apart: dict[str, str] = {}
    if target is not None:
        steps = {
            c: (cs.spread.mean_s, *cs.spread.interval()) for c, cs in spreads.items() if cs.spread is not None
        }
        blocks, ranked = projection_section(rows, target, steps)
        projection.append(plots.Section("Projection to the production run", blocks))
        projected = {
            row.candidate: (p.mid.cost_usd, p.mid.effective_ratio)  # type: ignore[attr-defined]
            for row, p in ranked
            if p.mid is not None and p.mid.cost_usd is not None
        }
        section, apart = availability_section(rows, ranked, target, queues or {}, ask)
        projection.append(section)
    decisions = [decision_text(d) for d in decide(rows, spreads, projected, apart)]
    outliers = outlier_lines(spreads)
    series_blocks, scaling_notes = scaling_section(rows, target.gpus if target is not None else None)
    projection += [plots.Section("Scaling series", series_blocks)] if series_blocks else []
    return [
        plots.Section(
            "Decision",
            [
                decisions + scaling_notes,
                qualification_cost(rows),
                *filter(None, [adaptive_line(parent, rows)]),
                DECISION_RULES,
            ],
        ),
        *projection,
        *(
            [plots.Section("Outliers (kept out of the medians and intervals)", [outliers])]
            if outliers
            else []
        ),
    ]


def qualification_cost(rows: Sequence[Row]) -> str:
    """What this qualification itself used: its runs' own GPU-hours and dollars (cost/*)."""
    runs = [r for row in rows for r in row.runs if r.finished]
    hours = [v for r in runs if (v := r.metric(K.COST_GPU_HOURS)) is not None]
    usd = [v for r in runs if (v := r.metric(K.COST_USD)) is not None]
    missing = len(runs) - len(usd)
    return (
        f"This qualification used {sum(hours):,.3g} GPU-hours and {_money(sum(usd))} over {len(runs)} finished "
        f"run(s) ({K.COST_GPU_HOURS}, {K.COST_USD})"
        + (f"; {missing} run(s) logged no cost and are not counted" if missing else "")
        + "."
    )


def _money(v: float) -> str:
    return f"${v:,.2f}" if v >= 1 else f"${v:.3g}"


DECISION_RULES = (
    "Only eligible candidates are ranked. Runner-up / winner is the ratio of their costs; its 95% interval comes "
    "from a bootstrap over each candidate's steady steps (circular blocks) and its repeats (run-to-run spread as a "
    "random effect), the cost's step-time share scaled by each draw. When the interval includes 1 the decision is "
    "a tie within the measured noise, with the repeats that would separate the two at the observed spread (90% "
    "power). Definitions and sources: docs/design.md, 'The decision and its confidence'."
)


def report_sections(
    sweep: Sweep,
    rows: list[Row],
    refs: References,
    uri: str,
    notes: list[str],
    target: Target | None = None,
    spreads: dict[str, CandidateSpread] | None = None,
    queues: dict[str, PartitionQueue] | None = None,
    ask: AskStart | None = None,
) -> list[plots.Section]:
    """notes[0] and notes[1] say which step-time and eval series were fetched, the rest go to the
    summary; `queues`: each partition's measured queue waits; `ask`: how to ask a partition when
    the production job would start (the login node's scheduler; None: not asked)."""
    spreads = spreads if spreads is not None else {}
    prices = {(r.partition, _price(r.price)) for r in rows}
    problems = sweep.problems + refs.problems
    definitions: list[Any] = [
        "'-' in a column: the value was not measured or is not defined for that run (it is absent, "
        "never drawn or averaged as 0).",
        plots.Table(["metric", "definition", "source"], METRIC_DEFINITIONS),
    ]
    return [
        *_decision_sections(rows, spreads, target, sweep.parent, queues, ask),
        plots.Section("Summary", [_header(sweep, uri, refs), *notes[2:], DEFINITIONS]),
        plots.Section(
            "Recommendation by cost per successful checkpoint (cheapest passing candidate per model)"
            + (": the Decision above ranks by projected cost" if target is not None else ""),
            [recommendation_list(rows)],
        ),
        plots.Section("Cheapest passing candidate per model x method", [method_list(rows)]),
        plots.Section("Candidates", [candidate_table(rows, spreads), CANDIDATE_NOTE]),
        plots.Section("Candidate details", [details_table(rows)]),
        plots.Section("Definitions", definitions),
        plots.Section(
            "Prices (dated snapshots)", [plots.Table(["partition", "price"], sorted(map(list, prices)))]
        ),
        _reference_section(sweep, rows),
        plots.Section("Data and quality target", [data_table(rows), DATA_DEFINITIONS]),
        *chat.chat_sections(sweep.runs, rows),
        plots.Section("Energy, node health and stragglers", [energy.energy_table(rows)]),
        plots.Section("Start-up per partition and node", startup.startup_blocks(sweep.runs)),
        plots.Section("Software stack per partition", stack.stack_blocks(sweep.runs)),
        plots.Section(
            "Plots",
            list(plots.all_plots(rows, notes[0] if notes else "", notes[1] if len(notes) > 1 else "")),
        ),
        plots.Section(
            "Problems", [problems] if problems else ["None: every run had the data the report uses."]
        ),
    ]


CANDIDATE_NOTE = (
    "MFU is against the partition's datasheet peak; on a CPU (or a GPU that is not the partition's) MFU* is "
    "against the matmul ceiling measured in the job. Steady step s: the mean step time of the steady windows "
    "of its accepted runs (outliers left out), with its 95% bootstrap interval."
)


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
    p.add_argument(
        "--sweeps",
        metavar="ID1,ID2,...",
        default=None,
        help="one decision over several sweeps (one per cluster or provider) of the same workload",
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (default runs/<sweep_id>/report/)")
    p.add_argument(
        "--tracking-uri", default=None, help="default: env MLFLOW_TRACKING_URI, else the project's SQLite"
    )
    p.add_argument("--experiment", default=K.EXPERIMENT, help="MLflow experiment name")
    p.add_argument("--references", type=Path, default=None, help="references YAML (conf/references/)")
    p.add_argument(
        "--histories", type=int, default=HISTORY_MAX_RUNS, help="step-time series to fetch at most (0: none)"
    )
    p.add_argument(
        "--no-tag-runs", dest="tag_runs", action="store_false", help="do not set sq.ref.* / sq.verdict tags"
    )
    p.add_argument(
        "--no-attach", dest="attach", action="store_false", help="do not log the pages to the parent run"
    )
    p.add_argument(
        "target",
        nargs="*",
        help="the production run to project each candidate to: project.tokens=2e10 (or project.steps=N) "
        "project.gpus=64 [project.deadline_h=H project.rate_per_gpu_hour=R]",
    )
    return p


def _open(args: argparse.Namespace) -> tuple[MlflowClient, str, Sweep, Sweep | None] | str:
    """The client, the URI, the sweep (and the one to compare with; with --sweeps, the sweeps
    combined); or why they cannot be read."""
    uri = args.tracking_uri or default_tracking_uri()
    ids = [i.strip() for i in (args.sweeps or "").split(",") if i.strip()]
    if args.sweeps is not None and (args.sweep or args.compare):
        return "report: --sweeps makes one report of several sweeps: give it without --sweep and --compare"
    if args.sweeps is not None and (len(ids) < 2 or len(set(ids)) < len(ids)):
        return (
            f"report: --sweeps needs two or more different sweep ids separated by commas (got {args.sweeps!r}); "
            "for one sweep, use --sweep ID"
        )
    if missing := missing_store(uri):
        return f"report: cannot read the sweep: {missing}"
    client = MlflowClient(tracking_uri=uri)
    try:
        if ids:
            parts = [load_sweep(client, args.experiment, i) for i in ids]
        sweep = load_sweep(client, args.experiment, args.sweep) if not ids else None
        other = load_sweep(client, args.experiment, args.compare) if args.compare else None
    except (SweepNotFound, MlflowException) as e:
        return f"report: cannot read the sweep from {uri}: {e}"
    named = [s.sweep_id for s in (*(parts if ids else [sweep]), other) if s is not None]
    if bad := [i for i in named if not is_plain_name(i)]:  # a tag from elsewhere (an imported bundle)
        return (
            f"report: the sweep id {bad[0]!r} of a parent run's {K.TAG_SWEEP_ID} tag is no plain name (a path?): "
            f"the report's folder is runs/<sweep id>, so nothing was written. Fix the tag in {uri}."
        )
    if not ids:
        assert sweep is not None
        return client, uri, sweep, other
    if differ := workload.differences(parts):
        return (
            f"report: sweeps {', '.join(ids)} did not measure the same workload, so one decision over them would "
            f"compare different jobs: {'; '.join(differ)}. Report each on its own (qualify report --sweep ID), or "
            "run them again with the same model, method, data, model.seq_len and batch shape (parallelism.micro_batch, "
            "grad_accum, GPUs). Nothing was written."
        )
    return client, uri, combine(parts), None


def _tag_runs(client: MlflowClient, sweep: Sweep, rows: list[Row], notes: list[str]) -> None:
    by_id = {r.run_id: r for r in sweep.runs}
    judged = [(by_id[i], res) for row in rows for i, res in row.run_refs.items()]
    try:
        notes.append(f"reference tags written on {write_tags(client, judged)} of {len(judged)} finished runs")
    except MlflowException as e:
        sweep.problems.append(f"could not write the reference tags on the runs: {e}")
    try:  # the candidate's costs beside each run's own, for the MLflow runs table
        notes.append(f"candidate costs logged on {write_candidate_costs(client, rows)} run(s)")
    except MlflowException as e:
        sweep.problems.append(f"could not log the candidate costs on the runs: {e}")


def _attach(client: MlflowClient, sweep: Sweep, paths: Sequence[Path], sections: list | None) -> int:
    try:
        for path in paths:
            if path.is_dir():
                client.log_artifacts(sweep.parent.run_id, str(path), artifact_path=f"report/{path.name}")
            else:
                client.log_artifact(sweep.parent.run_id, str(path), artifact_path="report")
    except (MlflowException, OSError) as e:
        log.error("could not attach the pages to run %s: %s", sweep.parent.run_id, e)
        return 1
    print(f"report: attached to run {sweep.parent.run_id} (artifacts report/)")
    if sections is not None:
        try:
            client.set_tag(sweep.parent.run_id, K.TAG_NOTE, parent_description(sweep, sections))
        except MlflowException as e:
            log.warning("could not write the parent run's description: %s", e)
    return 0


def report_main(argv: list[str], ask: AskStart | None = None) -> int:
    """`qualify report`; `ask`: the login node's way to ask a partition when a job of the
    production shape would start (pipeline.submit's scheduler), None where none answers."""
    args = build_parser().parse_args(argv)
    try:
        target = parse_target(args.target)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    opened = _open(args)
    if isinstance(opened, str):
        print(opened, file=sys.stderr)
        return 2
    client, uri, sweep, other = opened
    refs = load_references(args.references or default_references())
    rows = build_rows(sweep, refs)
    notes = [attach_step_times(client, rows, args.histories), attach_eval_curves(client, rows)]
    if other is not None:
        stem, title = (
            f"compare-{other.sweep_id}",
            f"slurm-qualify: sweep {sweep.sweep_id} vs {other.sweep_id}",
        )
        rows_b = build_rows(other, load_references(args.references or default_references()))
        sections = compare_sections(sweep, other, rows, rows_b)
    else:
        spreads = candidate_spreads(client, rows, sweep.runs)
        drop_outliers_from_medians(rows, spreads)
        if args.tag_runs and not sweep.parts:  # several sweeps: each run keeps its own sweep's figures
            _tag_runs(client, sweep, rows, notes)
        stem, title = "report", f"slurm-qualify report: sweep {sweep.sweep_id}"
        if sweep.parts:
            ask = None  # another cluster's queue cannot be asked from this login node
            stem, title = (
                f"sweeps-{'+'.join(s.sweep_id for s in sweep.parts)}",
                f"slurm-qualify report: sweeps {sweep.sweep_id}",
            )
        queues = None  # the queues are read only for the time to result of a projection
        if target is not None:
            waits = run_waits(sweep.runs, lambda rs: fetch_series(client, rs, K.TIME_QUEUE_WAIT_S))
            queues = partition_queues(rows, waits)
        sections = report_sections(sweep, rows, refs, uri, notes, target, spreads, queues, ask)
        if sweep.parts:
            sections.insert(1, clusters_section(sweep.parts))
        for section in sections:  # one run's power and utilisation series: a few API calls
            if section.title == "Energy, node health and stragglers":
                section.blocks.append(energy.power_plot(client, rows))
    home_id = sweep.parts[0].sweep_id if sweep.parts else sweep.sweep_id  # several: the first one's folder
    out = args.out or SweepDir(project_home() / RUNS_DIR / home_id).report
    paths = plots.write_pages(out, stem, title, sections)
    print(f"report: wrote {paths[0]} and {paths[1]}")
    if sweep.parts:  # it belongs to no one sweep's parent run: the pages stay in the folder
        return 0
    return _attach(client, sweep, paths, sections if other is None else None) if args.attach else 0


REPORT_MARK = "\n\n---\n**From `make report`:**"


def parent_description(sweep: Sweep, sections: Sequence[plots.Section]) -> str:
    """The parent run's description (the MLflow UI renders it as Markdown on the run's page):
    the sweep's own summary, written as it closed, then the report's Decision and Candidates
    sections (their tables and lists, no plots); a later report replaces its own part."""
    own = sweep.parent.tag(K.TAG_NOTE).split(REPORT_MARK)[0]
    chosen = [
        plots.Section(s.title, [b for b in s.blocks if not isinstance(b, plots.Plot)])
        for s in sections
        if s.title in ("Decision", "Candidates")
    ]
    body = plots.render_markdown(f"sweep {sweep.sweep_id}", chosen, "report_plots").split("\n", 2)[2]
    return f"{own}{REPORT_MARK}\n\n{body}".strip()


if __name__ == "__main__":
    sys.exit(report_main(sys.argv[1:]))
