"""Scaling series (docs/design.md, "Projection"): a candidate's points at several sizes (tag
sq.series, sizes in sq.gpus), the communication model fitted to them
(pipeline/measure/scaling.py), and its throughput per GPU at the target's GPU count, with a band.

From each point (the median over its accepted runs of each metric's latest value: the last timed
step's): the split perf/compute_s, comm/exposed_s, perf/optimizer_s; the collectives of the step
(comm/step_<op>_bytes, _calls, _busbw_gbps) and the probe's messages at the ZeRO stage's bucket
sizes (comm/bucket_<op>_bytes, _busbw_gbps) as timings for the alpha-beta fit. The model:
step time(N) = compute + optimizer + data wait + comm(N), the collectives being the ones the
series measured (their sizes do not depend on N: all-gather's is the whole output), comm(N) their
alpha-beta time at N ranks. A candidate measured at one size gets that size's fit and the wider
band `ONE_SIZE_LABEL`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.contract.outcome import Outcome
from pipeline.measure.comm import bus_factor
from pipeline.measure.scaling import (
    ONE_SIZE_LABEL,
    AlphaBeta,
    Collective,
    StepModel,
    Timing,
    crossover,
    fit_alpha_beta,
    one_size_band,
)
from pipeline.tracking import keys as K


def _median(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(xs) if xs else None


@dataclass(frozen=True)
class SizePoint:
    """One size of a series: medians over its runs."""

    gpus: int
    step_s: float
    compute_s: float
    exposed_s: float  # the collectives' transfers (comm/exposed_s - comm/skew_s)
    other_s: float  # optimizer step, data wait, skew: constant in N in the model
    tokens_per_s_per_gpu: float | None
    timings: tuple[Timing, ...]
    collectives: tuple[Collective, ...]

    @property
    def efficiency(self) -> float:
        """(step - the collectives' transfers) / step: the share of linear scaling from one GPU
        kept at this size (the model's `StepModel.efficiency` at the same size)."""
        return (self.step_s - self.exposed_s) / self.step_s


def _timings(runs: Sequence, gpus: int) -> tuple[tuple[Timing, ...], tuple[Collective, ...]]:
    timings, colls = [], []
    for op in K.COMM_STEP_OPS:
        nbytes = _median([r.metric(K.comm_step_op_bytes(op)) for r in runs])
        calls = _median([r.metric(K.comm_step_op_calls(op)) for r in runs])
        bw = _median([r.metric(K.comm_step_op_busbw(op)) for r in runs])
        if not nbytes or not calls:
            continue
        n_calls = max(1, round(calls))
        colls.extend([Collective(op, nbytes / n_calls, "measured")] * n_calls)  # one message each
        wire = nbytes * bus_factor(gpus, op)
        if bw and wire > 0:
            timings.append(Timing(op, nbytes, gpus, wire / (bw * 1e9), n_calls))
    return tuple(timings + _bucket_timings(runs, gpus)), tuple(colls)


def _bucket_timings(runs: Sequence, gpus: int) -> list[Timing]:
    """The probe's collectives at the ZeRO stage's bucket sizes (comm/bucket_<op>_bytes and
    _busbw_gbps), one call each: (size, time) points of the same link for the fit, not part of the
    step (the step's collectives are its counted ones)."""
    out = []
    for op in K.COMM_STEP_OPS:
        nbytes = _median([r.metric(K.comm_bucket_op_bytes(op)) for r in runs])
        bw = _median([r.metric(K.comm_bucket_op_busbw(op)) for r in runs])
        wire = (nbytes or 0.0) * bus_factor(gpus, op)
        if nbytes and bw and wire > 0:
            out.append(Timing(op, nbytes, gpus, wire / (bw * 1e9), 1))
    return out


def size_point(runs: Sequence, gpus: int) -> SizePoint | None:
    """The point at `gpus` from its runs; None when the split was not measured."""
    step = _median([r.metric(K.PERF_TIMED_STEP_S) for r in runs])  # the step the split is of
    compute = _median([r.metric(K.PERF_COMPUTE_S) for r in runs])
    exposed = _median([r.metric(K.COMM_EXPOSED_S) for r in runs])
    if step is None or compute is None or exposed is None or step <= 0:
        return None
    # the waits for late ranks are not transfers: they stay with compute (not modelled in N)
    exposed -= _median([r.metric(K.COMM_SKEW_S) for r in runs]) or 0.0
    other = max(0.0, step - compute - exposed)
    tps = _median([r.metric(K.PERF_TOKENS_PER_S) for r in runs])
    timings, colls = _timings(runs, gpus)
    return SizePoint(gpus, step, compute, exposed, other, tps / gpus if tps else None, timings, colls)


@dataclass
class Series:
    """One candidate's scaling series, its fit and model; `note` says why there is no model."""

    candidate: str
    points: list[SizePoint]
    fit: AlphaBeta | None = None
    model: StepModel | None = None
    note: str = ""
    residuals: dict[int, float] = field(default_factory=dict)  # gpus -> measured - modelled step s

    @property
    def one_size(self) -> bool:
        return len(self.points) == 1

    @property
    def label(self) -> str:
        sizes = ", ".join(str(p.gpus) for p in self.points)
        return (
            ONE_SIZE_LABEL
            if self.one_size
            else f"scaling measured at {len(self.points)} sizes ({sizes} GPUs)"
        )

    def band_s(self, n: int) -> tuple[float, float]:
        assert self.model is not None
        return one_size_band(self.model, n) if self.one_size else self.model.band_s(n)

    def per_gpu_at(self, n: int) -> tuple[float, float, float] | None:
        """Tokens/s per GPU at n GPUs (model, low, high): the largest size's measured throughput
        x its modelled step time / the step time at n; None without a model or a throughput."""
        ref = self.points[-1]
        if self.model is None or ref.tokens_per_s_per_gpu is None:
            return None
        base = ref.tokens_per_s_per_gpu * self.model.step_s(ref.gpus)
        lo_s, hi_s = self.band_s(n)
        return base / self.model.step_s(n), base / hi_s, base / lo_s


def fit_series(candidate: str, runs: Sequence) -> Series | None:
    """A candidate's series from its runs (accepted ones when any); None without a split point."""
    good = [r for r in runs if r.tag(K.TAG_OUTCOME) == Outcome.ACCEPTED] or list(runs)
    sizes = sorted({g for g in (r.gpus() for r in good) if g and g > 1})
    points = [p for g in sizes if (p := size_point([r for r in good if r.gpus() == g], g)) is not None]
    if not points:
        return None
    series = Series(candidate, points)
    timings = [t for p in points for t in p.timings]
    try:
        series.fit = fit_alpha_beta(timings, relative=False)  # seconds of step time matter
    except ValueError as e:
        if len(points) > 1 or not timings:
            series.note = f"no communication model: {e}"
            return series
        series.fit = bandwidth_only(timings)  # one size: its measured bandwidth, no latency term
    ref = points[-1]
    series.model = StepModel(
        ref.compute_s + ref.other_s,
        ref.collectives,
        series.fit,
        bucket_bytes=max(c.size_bytes for c in ref.collectives),
    )
    series.residuals = {p.gpus: p.step_s - series.model.step_s(p.gpus) for p in points}
    return series


def bandwidth_only(timings: Sequence[Timing]) -> AlphaBeta:
    """The model of one size whose collectives cannot separate alpha from beta (ZeRO-1/2's
    all-reduce and all-gather scale alike): alpha 0, beta = their time / their wire bytes."""
    wire = sum(t.regressors()[1] for t in timings)
    beta = sum(t.seconds for t in timings) / wire
    res = tuple(t.seconds - beta * t.regressors()[1] for t in timings)
    return AlphaBeta(0.0, beta, ((0.0, 0.0), (0.0, 0.0)), res, len(timings))


def series_key(run: object) -> str:
    """A run's series: its sq.series tag without the sweep id; its candidate for runs logged
    before the tag existed."""
    tag = run.tag(K.TAG_SERIES)  # type: ignore[attr-defined]
    return tag.split("/", 1)[1] if "/" in tag else run.candidate  # type: ignore[attr-defined]


def series_runs(rows: Sequence) -> dict[str, list]:
    """Each report row's candidate -> the runs of its whole series (every row of the same
    sq.series: the candidate at its other sizes too)."""
    by_key: dict[str, list] = {}
    for row in rows:
        for r in row.runs:
            by_key.setdefault(series_key(r), []).append(r)
    return {row.candidate: by_key[series_key(row.runs[0])] for row in rows if row.runs}


def series_by_key(rows: Sequence) -> dict[str, tuple[Series, list]]:
    """Every series of the report's rows (rows: analysis.table's, with .candidate and .runs) with
    the rows it spans."""
    groups: dict[str, list] = {}
    for row in rows:
        if row.runs:
            groups.setdefault(series_key(row.runs[0]), []).append(row)
    out = {}
    for key, members in groups.items():
        s = fit_series(key, [r for row in members for r in row.runs])
        if s is not None:
            out[key] = (s, members)
    return out


def projected_per_gpu(candidate: str, runs: Sequence, gpus: int) -> tuple[float, str, float, float] | None:
    """Tokens/s per GPU at `gpus` from the candidate's fitted model, where it came from (for the
    projection's inputs), and its band (low, high); None without a model (the projection then
    scales linearly)."""
    series = fit_series(candidate, runs)
    at = series.per_gpu_at(gpus) if series is not None else None
    if series is None or at is None:
        return None
    mid, low, high = at
    band = "bus bandwidth / 2 to x 2" if series.one_size else "2 standard errors of the fit"
    return (
        mid,
        f"modelled at {gpus} GPUs: compute + alpha-beta communication ({series.label}); "
        f"band {low:.4g} - {high:.4g} ({band})",
        low,
        high,
    )


def _cost_weight(series: Series, price: float | None) -> float:
    """Seconds of a step -> cost (or time) per token: price (1 without) / tokens per step per GPU."""
    ref = series.points[-1]
    assert series.model is not None and ref.tokens_per_s_per_gpu is not None
    return (price or 1.0) / (ref.tokens_per_s_per_gpu * series.model.step_s(ref.gpus))


def bandwidth_text(fit: AlphaBeta | None) -> str:
    """The fit's bus bandwidth in GB/s; "not resolved" when its per-byte time is 0 (the timings
    did not grow with the bytes, so 1 / beta is no bandwidth), never "inf"."""
    if fit is None or not math.isfinite(fit.busbw):
        return "not resolved (the timings did not grow with the message size)"
    return f"{fit.busbw / 1e9:.3g} GB/s"


def ranking_change(
    a: Series, b: Series, prices: tuple[float | None, float | None], target: int
) -> str | None:
    """When the better of two candidates at their measured size is not the better at `target`
    GPUs (cost per token with both prices, else time per token), a sentence naming the sizes
    and where it changes; None when the ranking holds (or a model is missing)."""
    if (
        a.model is None
        or b.model is None
        or not a.points[-1].tokens_per_s_per_gpu
        or not b.points[-1].tokens_per_s_per_gpu
    ):
        return None
    priced = None not in prices
    wa, wb = (_cost_weight(a, prices[0] if priced else None), _cost_weight(b, prices[1] if priced else None))
    lo = min(a.points[-1].gpus, b.points[-1].gpus)
    if target <= lo:
        return None
    at = crossover(a.model, b.model, lo, target, wa, wb)
    if at is None:
        return None
    first, second = (a, b) if wa * a.model.step_s(lo) < wb * b.model.step_s(lo) else (b, a)
    what = "cost per token" if priced else "time per token"
    comm = first.model.comm_s(target) if first.model else math.nan
    return (
        f"{first.candidate} wins on {what} at {lo} GPUs (measured); at {target} GPUs {second.candidate} wins: "
        f"the communication of {first.candidate} ({comm:.3g} s a step at {target} GPUs, fitted bus bandwidth "
        f"{bandwidth_text(first.fit)}, latency {first.fit.alpha_s * 1e6 if first.fit else math.nan:.3g} us a step) is the "
        f"bottleneck; the ranking changes at {at} GPUs (fitted model)"
    )


# --- the report's scaling section ----------------------------------------------------------------


def _series_rows(series: Series, target: int | None) -> list[list[str]]:
    out = []
    for p in series.points:
        model = series.model.step_s(p.gpus) if series.model else None
        out.append(
            [
                series.candidate,
                str(p.gpus),
                f"{p.step_s:.4g} s",
                f"{p.exposed_s:.3g} s",
                f"{p.efficiency:.1%}",
                "-" if model is None else f"{model:.4g} s ({series.residuals[p.gpus]:+.2g} s)",
            ]
        )
    if target is not None and series.model is not None:
        lo, hi = series.band_s(target)
        eff = series.model.efficiency(target)
        out.append(
            [
                series.candidate,
                f"{target} (target)",
                f"{series.model.step_s(target):.4g} s ({lo:.4g} - {hi:.4g})",
                f"{series.model.comm_s(target):.3g} s",
                f"{eff:.1%} ({series.model.compute_s / hi:.1%} - {series.model.compute_s / lo:.1%})",
                series.label,
            ]
        )
    return out


def scaling_section(rows: Sequence, target: int | None) -> tuple[list, list[str]]:
    """The report's blocks for the series (a table, the fits, a plot) and the decision's lines
    where the fitted model changes a ranking; ([], []) when no candidate has a split point."""
    from analysis import plots

    found = series_by_key(rows)
    if not found:
        return [], []
    series = {key: s for key, (s, _) in found.items()}
    table = []
    fits = []
    for s in series.values():
        table.extend(_series_rows(s, target))
        if s.fit is not None:
            fits.append(
                f"{s.candidate}: alpha {s.fit.alpha_s * 1e6:.3g} us a step, bus bandwidth {bandwidth_text(s.fit)}, "
                f"from {s.fit.samples} timed collectives; fit residuals "
                + ", ".join(f"{r * 1e3:+.2g} ms" for r in s.fit.residuals)
                + (f" ({s.fit.bound} held at 0: the free fit made it negative)" if s.fit.bound else "")
            )
        else:
            fits.append(f"{s.candidate}: {s.note}")
    blocks: list = [
        "Each series (a candidate at several sizes, tag sq.series): the measured points (median over runs), "
        "step time, the collectives' transfer time in it (comm/exposed_s less the waits for late ranks, "
        "comm/skew_s), efficiency = (step - transfers) / step; the model's step time at each size "
        "(residual = measured - model) and at the target, with its band.",
        plots.Table(
            ["series", "GPUs", "step time", "communication (transfers)", "efficiency", "model"], table
        ),
        "The alpha-beta fits (t = steps x alpha + wire bytes / bus bandwidth):",
        fits,
        scaling_plot(series, target),
    ]
    return blocks, _ranking_notes(found, target)


def _ranking_notes(found: dict[str, tuple[Series, list]], target: int | None) -> list[str]:
    """The decision's lines: per model x method, each pair of series whose ranking changes."""
    if target is None:
        return []
    groups: dict[tuple[str, str], list[tuple[Series, float | None]]] = {}
    for s, members in found.values():
        row = members[-1]
        price = row.price.usd_per_gpu_hour if row.price is not None else None
        groups.setdefault((row.model, row.method), []).append((s, price))
    notes = []
    for group in groups.values():
        for i, (sa, pa) in enumerate(group):
            for sb, pb in group[i + 1 :]:
                line = ranking_change(sa, sb, (pa, pb), target)
                if line:
                    notes.append(line)
    return notes


def scaling_plot(series: dict[str, Series], target: int | None) -> object:
    """Per series: measured step times, the fitted curve to the target, and the target marked."""
    from matplotlib.figure import Figure

    from analysis import plots

    title = "Scaling series: measured step time and the fitted model"
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, s in enumerate(series.values()):
        color = f"C{i % 10}"
        ax.plot([p.gpus for p in s.points], [p.step_s for p in s.points], "o", color=color, label=s.candidate)
        if s.model is None:
            continue
        top = max(target or 0, s.points[-1].gpus)
        xs = sorted(
            {2**k for k in range(1, max(2, math.ceil(math.log2(top))) + 1)}
            | {p.gpus for p in s.points}
            | {top}
        )
        ax.plot(xs, [s.model.step_s(n) for n in xs], "-", color=color, linewidth=1)
        if target is not None:
            lo, hi = s.band_s(target)
            ax.errorbar(
                [target],
                [s.model.step_s(target)],
                yerr=[[s.model.step_s(target) - lo], [hi - s.model.step_s(target)]],
                fmt="s",
                color=color,
                capsize=3,
            )
    if target is not None:
        ax.axvline(target, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs (dots: measured; line: fitted model; square: the target with its band)")
    ax.set_ylabel("step time, s")
    ax.set_title(title)
    fig.legend(loc="outside lower center", ncols=2, fontsize=7)
    return plots.Plot("scaling", title, plots._png(fig))
