"""A candidate's scaling series (docs/design.md, "Projection"): its points at several sizes
(tag sq.series, sizes in sq.gpus), each from the median over its runs of the last timed step's
split, its collectives (size classes) and exposed share; the two-level communication fit
(pipeline/measure/fabric.py), the model with compute per size, and the judgement of what the
series can support: refused where compute per rank changed beyond the noise, or past one node
where no network figure is known; what was measured and what assumed."""

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
from pipeline.measure.scaling import ONE_SIZE_LABEL, AlphaBeta, Collective, Timing, one_size_band
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
