"""Scaling series in the report and the projection (docs/design.md, "Projection"): each series
(analysis/series.py: its points, the two-level fit, compute per size, overlap, what it can
support) grouped from the report's rows, its throughput per GPU at the target's GPU count with a
band and the projection's inputs about it (measured, assumed, "do not extrapolate beyond"), the
ranking change between series, and the report's "Scaling series" section."""

from __future__ import annotations

import math
from collections.abc import Sequence

from analysis.series import Series as Series
from analysis.series import SizePoint as SizePoint
from analysis.series import exposed_share as exposed_share
from analysis.series import fit_series as fit_series
from analysis.series import overlap_bound as overlap_bound
from analysis.series import size_classes as size_classes
from analysis.series import size_point as size_point
from pipeline.measure.scaling import AlphaBeta, crossover
from pipeline.tracking import keys as K


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


def projected_per_gpu(
    candidate: str, runs: Sequence, gpus: int
) -> tuple[tuple[float, str, float, float] | None, dict[str, tuple[float, str]]]:
    """Tokens/s per GPU at `gpus` from the candidate's fitted model, where it came from and its
    band (low, high), or None where there is no model or the series cannot support `gpus` (the
    projection then scales linearly); and the projection's inputs about the series: what was
    measured, what assumed, the bound of overlap, and "do not extrapolate beyond"."""
    series = fit_series(candidate, runs)
    if series is None:
        return None, {}
    extra = series_inputs(series, gpus)
    at = series.per_gpu_at(gpus)
    if at is None:
        return None, extra
    mid, low, high = at
    band = "bus bandwidth / 2 to x 2" if series.one_size else "2 standard errors of the fits"
    return (
        mid,
        f"modelled at {gpus} GPUs: compute + exposed two-level alpha-beta communication ({series.label}); "
        f"band {low:.4g} - {high:.4g} ({band})",
        low,
        high,
    ), extra


def series_inputs(series: Series, gpus: int) -> dict[str, tuple[float, str]]:
    """The series' lines of a projection's inputs (value, text)."""
    out: dict[str, tuple[float, str]] = {}
    if series.measured:
        out["scaling_measured"] = (float(len(series.points)), "measured: " + "; ".join(series.measured))
    if series.assumed:
        out["scaling_assumed"] = (float(len(series.assumed)), "assumed: " + "; ".join(series.assumed))
    if series.beyond is not None and gpus > series.beyond:
        out["do_not_extrapolate_beyond_gpus"] = (float(series.beyond), series.refused)
    bound = overlap_bound(series, gpus)
    if bound and series.supports(gpus):
        out["overlap_bound"] = (gpus, bound)
    return out


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
    if target is not None and series.model is not None and not series.supports(target):
        out.append(
            [
                series.candidate,
                f"{target} (target)",
                "-",
                "-",
                "-",
                f"not projected ({series.label}): {series.refused}",
            ]
        )
    elif target is not None and series.model is not None:
        lo, hi = series.band_s(target)
        eff = series.model.efficiency(target)
        out.append(
            [
                series.candidate,
                f"{target} (target)",
                f"{series.model.step_s(target):.4g} s ({lo:.4g} - {hi:.4g})",
                f"{series.model.comm_s(target):.3g} s",
                f"{eff:.1%} ({series.model.compute(target) / hi:.1%} - {series.model.compute(target) / lo:.1%})",
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
        fits.extend(fit_lines(s))
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


def _level_text(name: str, fit: AlphaBeta) -> str:
    return (
        f"{name}: alpha {fit.alpha_s * 1e6:.3g} us a step, bus bandwidth {bandwidth_text(fit)}, "
        f"from {fit.samples} timed collectives; fit residuals "
        + ", ".join(f"{r * 1e3:+.2g} ms" for r in fit.residuals)
        + (f" ({fit.bound} held at 0)" if fit.bound else "")
    )


def fit_lines(s: Series) -> list[str]:
    """The series' fits, what was measured and assumed, and why it is not extrapolated."""
    if s.links is None or s.fit is None:
        return [f"{s.candidate}: {s.note}"]
    two = s.links.inter is not None
    out = [f"{s.candidate}: " + _level_text("intra-node level" if two else "one level", s.fit)]
    if s.links.inter is not None:
        out.append(f"{s.candidate}: " + _level_text("inter-node level (a node's network)", s.links.inter))
    out.append(f"{s.candidate}: measured: " + "; ".join(s.measured))
    if s.assumed:
        out.append(f"{s.candidate}: assumed: " + "; ".join(s.assumed))
    if s.refused:
        out.append(f"{s.candidate}: {s.refused}")
    return out


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
        top = max(target or 0, s.points[-1].gpus) if s.beyond is None else s.beyond
        xs = sorted(
            {2**k for k in range(1, max(2, math.ceil(math.log2(top))) + 1)}
            | {p.gpus for p in s.points}
            | {top}
        )
        ax.plot(xs, [s.model.step_s(n) for n in xs], "-", color=color, linewidth=1)
        if target is not None and s.supports(target):
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
