"""Each candidate projected to the production run the user is buying for (docs/design.md,
"Projection"): from what its runs measured (steady tokens/s per GPU, checkpoint stall, restart
time, start-up) and an assumed interruption rate per GPU-hour (the partition's, with its
source, or the Llama 3 figure), the Young/Daly checkpoint interval, the expected wall time,
effective training time ratio, GPU-hours and cost to finish, with a band at half and twice the
rate. Every input says where it came from, so a reviewer can see what was measured and what
was assumed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from analysis.scaling import projected_per_gpu, series_runs
from pipeline.measure.projection import (
    DEFAULT_RATE_PER_GPU_HOUR,
    DEFAULT_RATE_SOURCE,
    Projection,
    RunModel,
    project_band,
    work_s_for_tokens,
)
from pipeline.tracking import keys as K

RATE_PARAM = "partition.interruptions_per_gpu_hour"
RATE_SOURCE_PARAM = "partition.interruptions_source"


@dataclass(frozen=True)
class Target:
    """The production run: tokens (or optimizer steps) on `gpus` GPUs, by an optional deadline."""

    gpus: int
    tokens: float | None = None
    steps: int | None = None
    deadline_h: float | None = None
    rate_per_gpu_hour: float | None = None  # overrides every partition's rate when set

    def __post_init__(self) -> None:
        if (self.tokens is None) == (self.steps is None):
            raise ValueError("give exactly one of project.tokens or project.steps")
        if self.gpus < 1:
            raise ValueError(f"project.gpus must be a positive integer, got {self.gpus}")
        for name in ("gpus", "tokens", "steps", "deadline_h", "rate_per_gpu_hour"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0 or (name == "rate_per_gpu_hour" and v == 0)):
                raise ValueError(f"project.{name} must be a positive number, got {v!r}")
            if v is not None and v > TARGET_MAX[name]:
                raise ValueError(
                    f"project.{name}={v:g} is over {TARGET_MAX[name]:g}, the largest this projection takes "
                    f"({TARGET_WHY[name]})"
                )


TARGET_KEYS = {"tokens": float, "steps": int, "gpus": int, "deadline_h": float, "rate_per_gpu_hour": float}
# sane maxima: far past any production run, well inside what a float holds
TARGET_MAX = {"tokens": 1e17, "steps": 1e12, "gpus": 1e7, "deadline_h": 1e6, "rate_per_gpu_hour": 10.0}
TARGET_WHY = {
    "tokens": "Llama 3 pre-trained on about 1.5e13 tokens",
    "steps": "a million times a long pre-training run",
    "gpus": "ten million GPUs",
    "deadline_h": "about 114 years",
    "rate_per_gpu_hour": "ten interruptions per GPU-hour",
}


def parse_target(items: Sequence[str]) -> Target | None:
    """`project.tokens=2e10 project.gpus=64` (the report's ARGS) -> Target; None when absent.
    Raises ValueError naming the key and what is allowed."""
    values: dict[str, float | int] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        name = key.removeprefix("project.")
        if not sep or not key.startswith("project.") or name not in TARGET_KEYS:
            raise ValueError(f"'{item}': projection keys are project.{{{', '.join(TARGET_KEYS)}}}=<number>")
        try:
            number = float(raw)
            values[name] = int(number) if TARGET_KEYS[name] is int else number
        except (ValueError, OverflowError):  # int(inf) overflows
            raise ValueError(f"'{item}': project.{name} must be a number") from None
        if TARGET_KEYS[name] is int and number != int(number):
            raise ValueError(f"'{item}': project.{name} must be an integer")
    if not values:
        return None
    if "gpus" not in values:
        raise ValueError("project.gpus is required with project.tokens or project.steps")
    return Target(**values)  # type: ignore[arg-type]


@dataclass
class CandidateProjection:
    candidate: str
    inputs: dict[str, tuple[float, str]] = field(default_factory=dict)
    """name -> (value, where it came from): measured by which key, or assumed and why."""
    band: tuple[Projection, Projection, Projection] | None = None  # rate/2, rate, 2*rate
    note: str = ""  # why there is no projection
    run: RunModel | None = None  # the model of the run at the assumed rate (for the plot)
    price: float | None = None
    meets_deadline: bool | None = None

    @property
    def mid(self) -> Projection | None:
        return self.band[1] if self.band else None


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(xs) if xs else None


def project_candidate(
    candidate: str, runs: Sequence, target: Target, price: float | None, series: Sequence | None = None
) -> CandidateProjection:
    """Project one candidate from its accepted runs (its finished runs when none was accepted);
    `series`: the runs of its scaling series (analysis.scaling.series_runs), default its own."""
    out = CandidateProjection(candidate)
    good = [r for r in runs if r.tag(K.TAG_OUTCOME) == K.OUTCOME_ACCEPTED] or list(runs)
    tps = _median([r.metric(K.PERF_TOKENS_PER_S) for r in good])
    gpus = _median([float(r.tag(K.TAG_GPUS) or "nan") for r in good])
    if tps is None or not gpus:
        out.note = "no steady-state throughput was measured"
        return out
    per_gpu = tps / gpus
    out.inputs["tokens_per_s_per_gpu"] = (per_gpu, f"measured: median {K.PERF_TOKENS_PER_S} / {K.TAG_GPUS}")
    scaled = projected_per_gpu(
        candidate, series or runs, target.gpus
    )  # the fitted model, when a split was measured
    if scaled is not None:
        per_gpu = scaled[0]
        out.inputs["tokens_per_s_per_gpu_at_target"] = scaled
    tokens = target.tokens
    if tokens is None:
        per_step = _median(
            [
                (r.metric(K.TRAIN_TOKENS) or math.nan) / (r.metric(K.TRAIN_STEPS) or math.nan)
                for r in good
                if r.metric(K.TRAIN_STEPS)
            ]
        )
        if per_step is None:
            out.note = "project.steps needs the candidate's tokens per step, which was not measured"
            return out
        tokens = per_step * (target.steps or 0)
        out.inputs["tokens"] = (tokens, f"project.steps x measured tokens per step ({per_step:.0f})")
    # a save holds training only while its state is copied to the host (the rest is written in
    # the background); runs from before ckpt/stall_s was logged saved synchronously
    stall = _median([r.metric(K.CKPT_STALL_S) for r in good])
    stall_src = f"measured: median {K.CKPT_STALL_S} (what a save holds the step loop: the host copy)"
    if stall is None:
        stall = _median([r.metric(K.CKPT_SAVE_S) for r in good])
        stall_src = (
            f"measured: median {K.CKPT_SAVE_S} (no {K.CKPT_STALL_S}: a synchronous save stalls for all of it)"
        )
    if stall is None:
        out.note = "no checkpoint was saved, so its cost is unknown"
        return out
    out.inputs["ckpt_stall_s"] = (stall, stall_src)
    starts = _median(
        [
            (r.metric(K.TIME_STARTUP_S) or math.nan) / (r.metric(K.ATTEMPTS) or math.nan)
            for r in good
            if r.metric(K.ATTEMPTS)
        ]
    )
    if starts is not None:
        out.inputs["start_s"] = (
            starts,
            f"measured: {K.TIME_STARTUP_S} / {K.ATTEMPTS} (start to engine ready)",
        )
    restart = _median([r.metric(K.RESTART_TOTAL_S) for r in runs])
    if restart is not None:
        out.inputs["restart_s"] = (
            restart,
            f"measured: median {K.RESTART_TOTAL_S} (signal to first step after resume)",
        )
    elif starts is not None:
        load = _median([r.metric(K.CKPT_LOAD_S) for r in good]) or 0.0
        restart = starts + load
        out.inputs["restart_s"] = (
            restart,
            "estimated: start-up + checkpoint load (no restart was measured; run a preempt drill)",
        )
    else:
        out.note = "neither a restart nor the start-up was measured"
        return out
    rates = {r.param_float(RATE_PARAM) for r in runs} - {None}
    if target.rate_per_gpu_hour is not None:
        rate, rate_src = target.rate_per_gpu_hour, "project.rate_per_gpu_hour (given)"
    elif len(rates) == 1:
        rate = float(rates.pop())  # type: ignore[arg-type]
        src = {r.params.get(RATE_SOURCE_PARAM, "") for r in runs} - {""}
        rate_src = f"partition: {next(iter(src))}" if src else "partition config"
    else:
        rate, rate_src = DEFAULT_RATE_PER_GPU_HOUR, f"assumed: {DEFAULT_RATE_SOURCE}"
    out.inputs["interruptions_per_gpu_hour"] = (rate, rate_src)
    run = RunModel(
        work_s=work_s_for_tokens(tokens, per_gpu, target.gpus),
        gpus=target.gpus,
        rate_per_gpu_hour=rate,
        ckpt_stall_s=stall,
        restart_s=restart,
        start_s=starts or 0.0,
    )
    out.inputs["work_s"] = (
        run.work_s,
        f"tokens / (tokens/s per GPU x {target.gpus} GPUs): "
        + ("the fitted scaling model" if scaled is not None else "linear scaling assumed"),
    )
    out.band = project_band(run, price)
    out.run, out.price = run, price
    if target.deadline_h is not None and out.mid is not None:
        out.meets_deadline = out.mid.wall_s <= target.deadline_h * 3600
    return out


# --- the report's projection section ----------------------------------------------------------


def project_rows(rows: Sequence, target: Target) -> list[tuple[object, CandidateProjection]]:
    """Every candidate's projection, cheapest projected cost first; candidates without one last."""
    out = []
    siblings = series_runs(rows)
    for row in rows:
        price = row.price.usd_per_gpu_hour if row.price is not None else None
        out.append(
            (row, project_candidate(row.candidate, row.runs, target, price, siblings.get(row.candidate)))
        )
    inf = float("inf")
    out.sort(
        key=lambda rp: (
            rp[1].mid is None or rp[1].mid.cost_usd is None,
            rp[1].mid.cost_usd if rp[1].mid and rp[1].mid.cost_usd is not None else inf,
        )
    )
    return out


def _h(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


def _usd(v: float | None) -> str:
    return "not defined (no price)" if v is None else f"${v:,.0f}"


def projection_section(
    rows: Sequence, target: Target
) -> tuple[list, list[tuple[object, CandidateProjection]]]:
    """The blocks of the report's projection section (a table and what each number rests on),
    and the projections, cheapest first."""
    from analysis import plots

    ranked = project_rows(rows, target)
    what = (
        f"{target.tokens:,.3g} tokens" if target.tokens is not None else f"{target.steps:,} optimizer steps"
    )
    head = (
        f"The production run: {what} on {target.gpus} GPUs"
        + (f", deadline {target.deadline_h:g} h" if target.deadline_h else "")
        + ". Each candidate is projected from its own measurements (throughput per GPU, checkpoint stall, "
        "restart, start-up) and an interruption rate per GPU-hour, checkpointing at the Young/Daly interval "
        "sqrt(2 x stall x mean time between interruptions); the band is the cost at half and twice that rate. "
        "Throughput at the target's GPU count comes from the candidate's fitted scaling model where its runs "
        "measured the step's communication (see 'Scaling series'), else it is scaled linearly (an assumption: "
        "scaling efficiency at that size is not measured). Candidates that did not pass are projected too, but not recommended."
    )
    table_rows = []
    for rank, (row, p) in enumerate(ranked, 1):
        passing = row.ineligible() is None  # type: ignore[attr-defined]
        if p.band is None:
            table_rows.append([str(rank), row.candidate, f"not projected: {p.note}", "", "", "", "", ""])  # type: ignore[attr-defined]
            continue
        low, mid, high = p.band
        table_rows.append(
            [
                str(rank),
                row.candidate + ("" if passing else f" (not recommended: {row.ineligible()})"),  # type: ignore[attr-defined]
                f"{_usd(mid.cost_usd)} ({_usd(low.cost_usd)} - {_usd(high.cost_usd)})",
                _h(mid.wall_s) + ("" if p.meets_deadline in (None, True) else " (misses the deadline)"),
                f"{mid.effective_ratio:.1%}",
                f"{mid.interval_s / 60:,.1f} min",
                f"{mid.gpu_hours:,.0f}",
                f"{p.inputs['interruptions_per_gpu_hour'][0]:.3g}/GPU-h",
            ]
        )
    inputs = []
    for row, p in ranked:
        if p.inputs:
            used = "; ".join(f"{k} = {v:.4g} ({src})" for k, (v, src) in p.inputs.items())
            inputs.append(f"{row.candidate}: {used}")  # type: ignore[attr-defined]
    blocks: list = [
        head,
        plots.Table(
            [
                "rank",
                "candidate",
                "projected cost (rate/2 - rate x2)",
                "expected wall time",
                "effective training time",
                "checkpoint interval (Young/Daly)",
                "GPU-hours",
                "interruption rate",
            ],
            table_rows,
        ),
        "What each projection used (measured, or assumed and why):",
        inputs or ["no candidate could be projected"],
        projection_plot(ranked),
    ]
    return blocks, ranked


def projection_plot(ranked: Sequence[tuple[object, CandidateProjection]]) -> object:
    """Projected cost to the target against the interruption rate, one line per candidate."""
    from matplotlib.figure import Figure

    from analysis import plots
    from pipeline.measure.projection import project

    have = [
        (row, p)
        for row, p in ranked
        if p.band is not None and p.mid is not None and p.mid.cost_usd is not None
    ]
    title = "Projected cost to the target against the interruption rate"
    if not have:
        return plots.Plot("projection", title, None, "no candidate has a price and a projection")
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    factors = [0.125, 0.25, 0.5, 1, 2, 4, 8]
    for i, (row, p) in enumerate(have):
        base = p.run
        assert base is not None and p.price is not None
        rates = [base.rate_per_gpu_hour * f for f in factors]
        costs = [
            float(project(RunModel(**{**base.__dict__, "rate_per_gpu_hour": r}), p.price).cost_usd or 0.0)
            for r in rates  # a price is set (checked above), so every cost is defined
        ]
        ax.plot(rates, costs, marker="o", markersize=3, color=f"C{i % 10}", label=row.candidate)  # type: ignore[attr-defined]
        ax.axvline(base.rate_per_gpu_hour, color=f"C{i % 10}", linestyle=":", linewidth=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("interruptions per GPU-hour (dotted: the rate each projection assumed)")
    ax.set_ylabel("projected cost to the target, USD")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=2, fontsize=7)
    return plots.Plot("projection", title, plots._png(fig))
