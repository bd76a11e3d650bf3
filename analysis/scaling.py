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
from pipeline.measure.fabric import (
    ASSUMED_ALPHA_S,
    BACKWARD_SHARE,
    DATASHEETS,
    SHEET_EFFICIENCY,
    FabricModel,
    NodeSheet,
    TwoLevel,
    compute_change,
    fit_two_level,
    sheet_levels,
)
from pipeline.measure.scaling import (
    ONE_SIZE_LABEL,
    AlphaBeta,
    Collective,
    Timing,
    crossover,
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
    other_s: float  # optimizer step, data wait, skew: with compute, per size
    tokens_per_s_per_gpu: float | None
    timings: tuple[Timing, ...]
    collectives: tuple[Collective, ...]
    per_node: int = 0  # ranks per node (parallelism.gpus_per_node); 0: not logged
    noise: float | None = None  # the step time's coefficient of variation (perf/step_time_cv)
    shares: tuple[tuple[str, float], ...] = ()  # per collective class: its exposed share, measured
    messages: tuple[tuple[Collective, int], ...] = ()  # per collective: size classes, how many

    @property
    def efficiency(self) -> float:
        """(step - the collectives' transfers) / step: the share of linear scaling from one GPU
        kept at this size (the model's `efficiency` at the same size)."""
        return (self.step_s - self.exposed_s) / self.step_s

    @property
    def work_s(self) -> float:
        """Compute per rank: the step less the collectives' transfers."""
        return self.compute_s + self.other_s


def size_classes(nbytes: float, calls: int, bucket: float | None) -> tuple[tuple[float, int], ...]:
    """A collective's calls as size classes, not one mean: as many bucket-sized messages as its
    bytes hold (the probe's comm/bucket_<op>_bytes, the ZeRO stage's bucket), the rest as one
    class of the remaining calls (the loss's 8-byte all-reduce, a last partial bucket); the mean
    when no bucket size was logged or the bytes are not more than one bucket's."""
    mean = ((nbytes / calls, calls),)
    if not bucket or bucket <= 0 or calls < 2:
        return mean
    big = int(nbytes / bucket + 1e-9)
    rest = nbytes - big * bucket
    if big < 1 or big >= calls or rest <= 0:
        return mean
    return ((bucket, big), (rest / (calls - big), calls - big))


def _timings(runs: Sequence, gpus: int) -> tuple[tuple[Timing, ...], tuple[Collective, ...], dict, tuple]:
    timings: list[Timing] = []
    colls: list[Collective] = []
    shares: dict[str, float] = {}
    messages: list[tuple[Collective, int]] = []
    for op in K.COMM_STEP_OPS:
        nbytes = _median([r.metric(K.comm_step_op_bytes(op)) for r in runs])
        calls = _median([r.metric(K.comm_step_op_calls(op)) for r in runs])
        bw = _median([r.metric(K.comm_step_op_busbw(op)) for r in runs])
        if not nbytes or not calls:
            continue
        n_calls = max(1, round(calls))
        colls.extend([Collective(op, nbytes / n_calls, "measured")] * n_calls)  # one message each
        classes = size_classes(nbytes, n_calls, _median([r.metric(K.comm_bucket_op_bytes(op)) for r in runs]))
        messages.extend((Collective(op, size, "measured"), k) for size, k in classes)
        wire = nbytes * bus_factor(gpus, op)
        if bw and wire > 0:
            timings.append(Timing(op, nbytes, gpus, wire / (bw * 1e9), n_calls, classes))
            shares[op] = 1.0
    return tuple(timings + _bucket_timings(runs, gpus)), tuple(colls), shares, tuple(messages)


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
    # the waits for late ranks are not transfers: they stay with compute (per size)
    exposed -= _median([r.metric(K.COMM_SKEW_S) for r in runs]) or 0.0
    other = max(0.0, step - compute - exposed)
    tps = _median([r.metric(K.PERF_TOKENS_PER_S) for r in runs])
    timings, colls, shares, messages = _timings(runs, gpus)
    share = exposed_share(runs, exposed)
    shares = {op: share for op in shares} if share is not None else {}
    per_node = _median([r.param_float("parallelism.gpus_per_node") for r in runs])
    works = [r.metric(K.PERF_COMPUTE_S) for r in runs]
    noise = _median([r.metric(K.PERF_STEP_CV) for r in runs])
    spread = _run_spread([w for w in works if w is not None])
    if spread is not None:
        noise = max(noise or 0.0, spread)
    return SizePoint(
        gpus, step, compute, exposed, other, tps / gpus if tps else None, timings, colls,
        int(per_node or 0), noise, tuple(sorted(shares.items())), messages,
    )  # fmt: skip


def exposed_share(runs: Sequence, transfers: float) -> float | None:
    """The share of the step's communication not hidden behind compute, measured: the timer
    blocks (gloo) or synchronizes (NCCL) around each collective, so a timed step loses the
    overlap an untimed one keeps; hidden = perf/timed_step_s - perf/step_time_p50_s (the untimed
    steps' median), exposed share = 1 - hidden / transfers. 1 where the difference is within the
    noise (2 x the step time's CV). One share for every class: the timer cannot split it. None
    when not measured."""
    timed = _median([r.metric(K.PERF_TIMED_STEP_S) for r in runs])
    plain = _median([r.metric(K.PERF_STEP_P50_S) for r in runs])
    cv = _median([r.metric(K.PERF_STEP_CV) for r in runs]) or 0.0
    if timed is None or plain is None or transfers <= 0:
        return None
    hidden = timed - plain
    if hidden <= 2 * cv * plain:
        return 1.0
    return max(0.0, 1.0 - hidden / transfers)


def _run_spread(values: Sequence[float]) -> float | None:
    """Half the range of the runs' compute over its median: the noise between runs of a size."""
    if len(values) < 2 or statistics.median(values) <= 0:
        return None
    return (max(values) - min(values)) / 2 / statistics.median(values)


@dataclass
class Series:
    """One candidate's scaling series, its fit and model; `note` says why there is no model,
    `refused` why the model must not be extrapolated past `beyond` GPUs."""

    candidate: str
    points: list[SizePoint]
    fit: AlphaBeta | None = None  # the intra-node (or only) level
    links: TwoLevel | None = None
    model: FabricModel | None = None
    note: str = ""
    residuals: dict[int, float] = field(default_factory=dict)  # gpus -> measured - modelled step s
    refused: str = ""
    beyond: int | None = None
    measured: list[str] = field(default_factory=list)
    assumed: list[str] = field(default_factory=list)

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

    def supports(self, n: int) -> bool:
        return self.model is not None and (self.beyond is None or n <= self.beyond)

    def per_gpu_at(self, n: int) -> tuple[float, float, float] | None:
        """Tokens/s per GPU at n GPUs (model, low, high): the largest size's measured throughput
        x its modelled step time / the step time at n; None without a model or a throughput, or
        past the size the series supports."""
        ref = self.points[-1]
        if self.model is None or ref.tokens_per_s_per_gpu is None or not self.supports(n):
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
    per_node = _per_node(points)
    try:
        series.links = fit_two_level(timings, per_node)  # unweighted: seconds of step time matter
    except ValueError as e:
        series.note = f"no communication model: {e}"
        return series
    series.fit = series.links.intra
    series.links = _with_network(series, good, per_node)
    ref = points[-1]
    series.model = FabricModel(
        ref.work_s,
        ref.messages,
        series.links,
        ref.shares,
        BACKWARD_SHARE * ref.compute_s,
        tuple((p.gpus, p.work_s) for p in points),
    )
    series.residuals = {p.gpus: p.step_s - series.model.step_s(p.gpus) for p in points}
    _judge(series)
    return series


def _per_node(points: Sequence[SizePoint]) -> int:
    """The series' GPUs per node: the one every point logged; the largest where they differ but
    every point is one node (e.g. 1x2 and 1x4); 0 (one level) otherwise or when not logged."""
    known = {p.per_node for p in points if p.per_node > 0}
    if len(known) == 1:
        return known.pop()
    if known and all(0 < p.gpus <= p.per_node for p in points):
        return max(known)
    return 0


def _with_network(series: Series, runs: Sequence, per_node: int) -> TwoLevel:
    """The series' levels, the inter-node one from the partition's NICs or its datasheet (stated
    as assumed) where no point spanned nodes; `beyond` one node where neither is known."""
    links = series.links
    assert links is not None
    sizes = ", ".join(str(p.gpus) for p in series.points)
    series.measured.append(f"compute per rank at {sizes} GPUs (each size its own)")
    series.measured.extend(f"{n}" for n in links.notes)
    if links.inter is not None:
        series.measured.append(f"intra-node and inter-node alpha/beta, fitted apart ({per_node} GPUs a node)")
        return links
    series.measured.append("one alpha/beta" + (f" within a node of {per_node} GPUs" if per_node else ""))
    if per_node <= 0:
        series.assumed.append("GPUs per node not logged: one level of fabric for every size")
        return links
    sheet, src = node_sheet(runs, per_node)
    if sheet is None:
        series.beyond = per_node
        series.refused = (
            f"no point spans nodes and the partition states no network ({src}): "
            f"do not extrapolate beyond {per_node} GPUs (one node); measure at 2 nodes "
            "(parallelism.nodes=1,2) or set partition.nics_per_node and partition.nic_gbps"
        )
        return links
    series.assumed.append(
        f"inter-node level from {src}: {sheet.nics_per_node} x {sheet.nic_gbps:g} Gb/s a node at "
        f"{SHEET_EFFICIENCY:.0%} of line rate, alpha {ASSUMED_ALPHA_S['inter'] * 1e6:g} us a step"
    )
    inter = sheet_levels(sheet).inter
    return TwoLevel(links.intra, inter, per_node, links.notes)


def node_sheet(runs: Sequence, per_node: int) -> tuple[NodeSheet | None, str]:
    """The node's network: partition.nics_per_node / partition.nic_gbps where set, else the
    datasheet of partition.gpu_type (assumed); (None, why) when neither."""
    gpu = next((r.params.get("partition.gpu_type") for r in runs if r.params.get("partition.gpu_type")), "")
    nics = _median([r.param_float("partition.nics_per_node") for r in runs])
    gbps = _median([r.param_float("partition.nic_gbps") for r in runs])
    sheet = DATASHEETS.get(gpu)
    if nics and gbps:
        nv = sheet.nvlink_gbs if sheet else 0.0
        return NodeSheet(per_node, int(nics), gbps, nv, "partition.nics_per_node, partition.nic_gbps"), (
            "the partition's partition.nics_per_node and partition.nic_gbps"
        )
    if sheet is None:
        return None, f"gpu_type '{gpu or '?'}' has no datasheet here"
    sheet = NodeSheet(
        per_node, int(nics or sheet.nics_per_node), gbps or sheet.nic_gbps, sheet.nvlink_gbs, sheet.source
    )
    return sheet, f"the {gpu} datasheet, assumed ({sheet.source})"


def _judge(series: Series) -> None:
    """Refuse to extrapolate a series whose compute per rank changed across sizes beyond its
    noise (the communication fit must not absorb it); state the overlap's bound."""
    assert series.model is not None
    change = compute_change([(p.gpus, p.work_s, p.noise) for p in series.points])
    if change:
        series.beyond = series.points[-1].gpus
        series.refused = (
            f"{change}: the ranks shared fewer cores or another node type at the larger size, so the "
            f"series cannot tell communication from compute; do not extrapolate beyond {series.beyond} GPUs. "
            "A series that would fit: the same compute per rank at every size (one rank per core or GPU, "
            "one node type)"
        )
    shares = ", ".join(f"{op} {v:.2f}" for op, v in series.points[-1].shares)
    if shares:
        series.measured.append(
            f"exposed share per collective at {series.points[-1].gpus} GPUs (timed vs untimed steps): {shares}"
        )
    else:
        series.assumed.append("exposed share 1 (no overlap): the untimed steps' time was not logged")
    series.assumed.append(
        f"the backward window, {BACKWARD_SHARE:.2g} of compute, bounds what overlap can hide (Kaplan et al. 2020)"
    )


def overlap_bound(series: Series, n: int) -> str | None:
    """A sentence where the size `n` needs more overlap than the backward pass can hide."""
    if series.model is None:
        return None
    e = series.model.exposure(n)
    if not e.capped:
        return None
    return (
        f"at {n} GPUs hiding the measured share needs {e.hide_wanted_s:.3g} s of overlap; the backward "
        f"pass holds {e.window_s:.3g} s: {e.exposed_s:.3g} s of {e.comm_s:.3g} s exposed"
    )


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
            [series.candidate, f"{target} (target)", "-", "-", "-", f"not projected: {series.refused}"]
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
