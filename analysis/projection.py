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
from typing import Any

from analysis.scaling import projected_per_gpu, series_runs
from pipeline.contract.outcome import Outcome
from pipeline.measure.band import Band, propagate
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
SCALING_FLOOR = 0.8
"""The band's lowest scaling efficiency at the target's GPU count: an assumption (a round figure,
not a measurement; the qualification runs on one or two nodes and cannot measure it)."""


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
    spread: Band | None = None  # every input's range propagated (pipeline/measure/band.py)

    @property
    def mid(self) -> Projection | None:
        return self.band[1] if self.band else None


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(xs) if xs else None


def _measured(
    out: CandidateProjection, good: Sequence, runs: Sequence, target: Target
) -> tuple[float, float] | None:
    """Throughput per GPU and the tokens to train, into out.inputs; None (with out.note) when missing."""
    tps = _median([r.metric(K.PERF_TOKENS_PER_S) for r in good])
    gpus = _median([float(r.tag(K.TAG_GPUS) or "nan") for r in good])
    if tps is None or not gpus:
        out.note = "no steady-state throughput was measured"
        return None
    per_gpu = tps / gpus
    out.inputs["tokens_per_s_per_gpu"] = (per_gpu, f"measured: median {K.PERF_TOKENS_PER_S} / {K.TAG_GPUS}")
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
            return None
        tokens = per_step * (target.steps or 0)
        out.inputs["tokens"] = (tokens, f"project.steps x measured tokens per step ({per_step:.0f})")
    return per_gpu, tokens


def _stall(out: CandidateProjection, good: Sequence) -> float | None:
    # a save holds training only while its state is copied to the host (the rest is written in
    # the background); runs from before ckpt/stall_s was logged saved synchronously
    stall = _median([r.metric(K.CKPT_STALL_S) for r in good])
    src = f"measured: median {K.CKPT_STALL_S} (what a save holds the step loop: the host copy)"
    if stall is None:
        stall = _median([r.metric(K.CKPT_SAVE_S) for r in good])
        src = (
            f"measured: median {K.CKPT_SAVE_S} (no {K.CKPT_STALL_S}: a synchronous save stalls for all of it)"
        )
    if stall is None:
        out.note = "no checkpoint was saved, so its cost is unknown"
        return None
    out.inputs["ckpt_stall_s"] = (stall, src)
    return stall


def _warm_part(r: Any) -> float:
    """What a run's ranks did not pay because they were forked warm (pipeline/sched/warm.py):
    the imports its server paid once, measured by the server; 0 for a cold run."""
    if r.tag(K.TAG_RANKS) != "warm":
        return 0.0
    paid = r.metric(K.STARTUP_WARM_IMPORT_S)
    return math.nan if paid is None else paid


def _cold_or_warm(runs: Sequence) -> tuple[list, bool]:
    """The cold runs when there are any (what a partition's job pays, measured); else every run,
    True: their start-ups are warm and each needs its server's imports added back."""
    cold = [r for r in runs if r.tag(K.TAG_RANKS) != "warm"]
    return (cold, False) if cold else (list(runs), bool(runs))


WARM_NOTE = f"; warm local ranks: + {K.STARTUP_WARM_IMPORT_S}, the imports their server paid once"


def _starts(good: Sequence) -> tuple[list[float | None], bool]:
    runs, warm = _cold_or_warm(good)
    return [
        (r.metric(K.TIME_STARTUP_S) or math.nan) / (r.metric(K.ATTEMPTS) or math.nan) + _warm_part(r)
        for r in runs
        if r.metric(K.ATTEMPTS)
    ], warm


def _restart(out: CandidateProjection, good: Sequence, runs: Sequence) -> tuple[float | None, float] | None:
    """(start-up, restart) seconds into out.inputs; None (with out.note) when neither was measured.
    A warm rank's start-up is a fork's: never used as it is (docs/design.md, "Warm ranks")."""
    values, warm = _starts(good)
    starts = _median(values)
    if starts is not None:
        how = "estimated" if warm else "measured"
        out.inputs["start_s"] = (
            starts,
            f"{how}: {K.TIME_STARTUP_S} / {K.ATTEMPTS} (start to engine ready){WARM_NOTE if warm else ''}",
        )
    restarted, warm = _cold_or_warm([r for r in runs if r.metric(K.RESTART_TOTAL_S) is not None])
    restart = _median([r.metric(K.RESTART_TOTAL_S) + _warm_part(r) for r in restarted])
    if restart is not None:
        how = "estimated" if warm else "measured"
        out.inputs["restart_s"] = (
            restart,
            f"{how}: median {K.RESTART_TOTAL_S} (signal to first step after resume){WARM_NOTE if warm else ''}",
        )
    elif starts is not None:
        restart = starts + (_median([r.metric(K.CKPT_LOAD_S) for r in good]) or 0.0)
        out.inputs["restart_s"] = (
            restart,
            "estimated: start-up + checkpoint load (no restart was measured; run a preempt drill)",
        )
    else:
        out.note = "neither a restart nor the start-up was measured"
        return None
    return starts, restart


def _rate(runs: Sequence, target: Target) -> tuple[float, str]:
    rates = {r.param_float(RATE_PARAM) for r in runs} - {None}
    if target.rate_per_gpu_hour is not None:
        return target.rate_per_gpu_hour, "project.rate_per_gpu_hour (given)"
    if len(rates) == 1:
        src = {r.params.get(RATE_SOURCE_PARAM, "") for r in runs} - {""}
        return float(rates.pop()), (f"partition: {next(iter(src))}" if src else "partition config")  # type: ignore[arg-type]
    return DEFAULT_RATE_PER_GPU_HOUR, f"assumed: {DEFAULT_RATE_SOURCE}"


def _range(values: Sequence[float | None], centre: float) -> tuple[float, float]:
    """(lowest, highest) of the measured values as multipliers of the centre (1, 1 with none)."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    if not xs or centre <= 0:
        return 1.0, 1.0
    return min(min(xs) / centre, 1.0), max(max(xs) / centre, 1.0)


def band_ranges(
    run: RunModel,
    good: Sequence,
    runs: Sequence,
    step_interval: tuple[float, float, float] | None,
    scaling: tuple[float, float] = (1.0, 1.0 / SCALING_FLOOR),
) -> dict[str, tuple[float, float]]:
    """Each band input's (low, high) multiplier (pipeline/measure/band.py). `scaling`: the work's
    multipliers at the target size: the fitted model's band when the candidate has a scaling
    series, else linear (1) to the assumed floor of the scaling efficiency."""
    ranges = {"interruption_rate": (0.5, 2.0), "scaling": scaling}
    if step_interval is not None:
        mean, lo, hi = step_interval
        ranges["throughput"] = (lo / mean, hi / mean)  # work scales with the mean step time
    stalls = [r.metric(K.CKPT_STALL_S) or r.metric(K.CKPT_SAVE_S) for r in good]
    ranges["ckpt_stall_s"] = _range(stalls, run.ckpt_stall_s)
    ranges["restart_s"] = _range([r.metric(K.RESTART_TOTAL_S) for r in runs], run.restart_s)
    return ranges


def project_candidate(
    candidate: str,
    runs: Sequence,
    target: Target,
    price: float | None,
    step_interval: tuple[float, float, float] | None = None,
    series: Sequence | None = None,
) -> CandidateProjection:
    """Project one candidate from its accepted runs (its finished runs when none was accepted);
    `step_interval`: its steady mean step time and 95% interval, for the band; `series`: the runs
    of its scaling series (analysis.scaling.series_runs), default its own."""
    out = CandidateProjection(candidate)
    good = [r for r in runs if r.tag(K.TAG_OUTCOME) == Outcome.ACCEPTED] or list(runs)
    measured = _measured(out, good, runs, target)
    stall = _stall(out, good) if measured else None
    times = _restart(out, good, runs) if stall is not None else None
    if measured is None or stall is None or times is None:
        return out
    (per_gpu, tokens), (starts, restart) = measured, times
    scaled, about = projected_per_gpu(candidate, series or runs, target.gpus)  # when a split was measured
    out.inputs.update(about)
    scaling = (1.0, 1.0 / SCALING_FLOOR)
    if scaled is not None:
        per_gpu, source, low, high = scaled
        out.inputs["tokens_per_s_per_gpu_at_target"] = (per_gpu, source)
        scaling = (min(1.0, per_gpu / high), max(1.0, per_gpu / low))  # work goes as 1 / throughput
    rate, rate_src = _rate(runs, target)
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
        + ("the fitted scaling model" if scaled is not None else "linear scaling assumed")
        + (
            " (the scaling series refused: see do_not_extrapolate_beyond_gpus)"
            if "do_not_extrapolate_beyond_gpus" in about
            else ""
        ),
    )
    out.band = project_band(run, price)
    out.run, out.price = run, price
    if price is not None:
        out.spread = propagate(run, price, band_ranges(run, good, runs, step_interval, scaling))
    if target.deadline_h is not None and out.mid is not None:
        out.meets_deadline = out.mid.wall_s <= target.deadline_h * 3600
    return out


# --- the report's projection section ----------------------------------------------------------


def project_rows(
    rows: Sequence, target: Target, steps: dict[str, tuple[float, float, float]] | None = None
) -> list[tuple[object, CandidateProjection]]:
    """Every candidate's projection, cheapest projected cost first; candidates without one last.
    `steps`: candidate -> its steady mean step time and 95% interval (for the band)."""
    out = []
    siblings = series_runs(rows)
    for row in rows:
        price = row.price.usd_per_gpu_hour if row.price is not None else None
        interval = (steps or {}).get(row.candidate)
        series = siblings.get(row.candidate)
        out.append((row, project_candidate(row.candidate, row.runs, target, price, interval, series)))
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


def _head(target: Target) -> str:
    what = (
        f"{target.tokens:,.3g} tokens" if target.tokens is not None else f"{target.steps:,} optimizer steps"
    )
    return (
        f"The production run: {what} on {target.gpus} GPUs"
        + (f", deadline {target.deadline_h:g} h" if target.deadline_h else "")
        + ". Each eligible candidate is projected from its own measurements (throughput per GPU, checkpoint "
        "stall, restart, start-up) and an interruption rate per GPU-hour, checkpointing at the Young/Daly "
        "interval sqrt(2 x stall x mean time between interruptions). The band propagates, one at a time and "
        "combined by root sum of squares, the 95% interval of the steady step time, the lowest and highest "
        "checkpoint stall and restart measured, half to twice the interruption rate, and the scaling: the "
        "fitted model's band where the candidate's runs measured the step's communication (see 'Scaling "
        "series'), else a scaling efficiency from 1 (linear: the central value) down to "
        f"{SCALING_FLOOR:g} (assumed; not measured at that size). "
        "Candidates that are not eligible are listed apart, not ranked."
    )


def _cells(p: CandidateProjection) -> list[str]:
    low, mid, high = p.band  # type: ignore[misc]
    band = f"{_usd(p.spread.low)} - {_usd(p.spread.high)}" if p.spread else "no price: no band"
    return [
        _usd(mid.cost_usd),
        band,
        f"{_usd(low.cost_usd)} - {_usd(high.cost_usd)}",
        _h(mid.wall_s) + ("" if p.meets_deadline in (None, True) else " (misses the deadline)"),
        f"{mid.effective_ratio:.1%}",
        f"{mid.interval_s / 60:,.1f} min",
        f"{mid.gpu_hours:,.0f}",
    ]


PROJECTION_HEADER = [
    "rank", "candidate", "projected cost", "band (all inputs)", "rate/2 - rate x2", "expected wall time",
    "effective training time", "checkpoint interval (Young/Daly)", "GPU-hours",
]  # fmt: skip


def _shares(p: CandidateProjection) -> str:
    if p.spread is None or not p.spread.shares:
        return "no band (no price, or no input varies)"
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(p.spread.shares.items(), key=lambda kv: -kv[1]))


def projection_section(
    rows: Sequence, target: Target, steps: dict[str, tuple[float, float, float]] | None = None
) -> tuple[list, list[tuple[object, CandidateProjection]]]:
    """The blocks of the report's projection section (the eligible candidates ranked, the others
    apart, each input's share of the band, what each number rests on), and the projections."""
    from analysis import plots

    ranked: list[tuple[Any, CandidateProjection]] = project_rows(rows, target, steps)
    eligible = [(row, p) for row, p in ranked if row.ineligible() is None and p.band is not None]
    table_rows = [[str(i), row.candidate, *_cells(p)] for i, (row, p) in enumerate(eligible, 1)]
    apart = [
        f"{row.candidate}: "
        + (f"not eligible ({row.ineligible()})" if p.band is not None else f"not projected: {p.note}")
        for row, p in ranked
        if (row, p) not in eligible
    ]
    shares = [f"{row.candidate}: {_shares(p)}" for row, p in eligible]
    inputs = [
        f"{row.candidate}: " + "; ".join(f"{k} = {v:.4g} ({src})" for k, (v, src) in p.inputs.items())
        for row, p in ranked
        if p.inputs
    ]
    blocks: list = [
        _head(target),
        plots.Table(PROJECTION_HEADER, table_rows)
        if table_rows
        else "No eligible candidate could be projected.",
        "Not ranked (not eligible, or not projected):",
        apart or ["none"],
        "Each input's share of the band (its squared swing over the sum of squares):",
        shares or ["no band"],
        "What each projection used (measured, or assumed and why):",
        inputs or ["no candidate could be projected"],
        projection_plot(eligible),
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
