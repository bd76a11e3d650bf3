"""Availability: how long each candidate's partition makes a job wait, and when the production
run would therefore finish (docs/design.md, "Time to result").

Two sources, both dated, since a queue is a snapshot:
- measured: every allocation of the qualification's own jobs records its queue wait
  (`time/queue_wait_s`, sacct Eligible -> Start, one point per attempt), read here through the
  MLflow API; the local launcher records none (absent, never 0);
- asked: the login node asks each partition when a job of the production shape would start
  (`sbatch --test-only`), through a callable the command passes in (`AskStart`: analysis/ never
  runs a Slurm command itself).

Time to result = the first job's estimated wait + the projected wall time, cut at the
partition's MaxTime into chained jobs, each later one waiting as long as the partition's
measured waits (low, median, high: the band) and paying a restart (pipeline.measure.projection
`time_to_result_band`). With a deadline, a candidate whose central time to result misses it is
listed apart, with its figures, and the cheapest candidate that meets it is named."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pipeline.measure.projection import QueueModel, TimeToResult, time_to_result_band
from pipeline.tracking import keys as K

MAX_TIME_PARAM = "partition.max_time_min"
SLURM_PARTITION_PARAM = "partition.slurm_partition"
GPUS_PER_NODE_PARAM = "partition.gpus_per_node"
SLURM_CLUSTER_PARAM = "partition.slurm_cluster"


@dataclass(frozen=True)
class StartAnswer:
    """A partition's answer to "when would a job of this shape start" (`sbatch --test-only`)."""

    asked_at: str
    """When it was asked (ISO 8601): the queue as it stood then."""
    wait_s: float | None = None
    """From the question to the estimated start; None when the partition did not say."""
    refused: str = ""
    """Why there is no estimate (Slurm refused the shape, cannot be asked, did not answer)."""


AskStart = Callable[..., Any]
"""(partition, nodes, GPUs per node, time limit in minutes[, cluster]) -> the partition's answer:
anything with `asked_at` (a datetime or ISO text), `wait_s` and `refused`, as StartAnswer (the
login node passes its scheduler's `start_estimate`). The cluster is passed only for a partition
on another cluster of the login node's slurmdbd (partition.slurm_cluster), asked there with -M."""


def as_answer(a: Any) -> StartAnswer:
    """A scheduler's answer as the report keeps it (its date as ISO text, to the second)."""
    when = a.asked_at.isoformat(timespec="seconds") if isinstance(a.asked_at, datetime) else str(a.asked_at)
    return StartAnswer(when, a.wait_s, a.refused)


@dataclass
class PartitionQueue:
    """One partition's queue, measured and asked."""

    partition: str
    waits_s: list[float] = field(default_factory=list)
    """Every queue wait its qualification jobs measured (every attempt)."""
    max_time_min: int | None = None
    """Its MaxTime (partition.max_time_min, from `qualify discover`); None: unknown, no limit used."""
    slurm_cluster: str | None = None
    """The cluster it lives on when it is another cluster of the login node's slurmdbd
    (partition.slurm_cluster): asked there with -M; None: the login node's own."""
    gpus_per_node: int | None = None
    answer: StartAnswer | None = None
    nodes: int | None = None  # the production job's nodes, as asked
    slurm_partition: str | None = None
    """The Slurm partition it is (partition.slurm_partition): what the scheduler is asked about."""

    @property
    def median_wait_s(self) -> float | None:
        return statistics.median(self.waits_s) if self.waits_s else None

    def model(self) -> tuple[QueueModel | None, str]:
        """The queue model of the time to result, and where its waits came from; None (with
        why) when neither source has a wait."""
        first = self.answer.wait_s if self.answer is not None else None
        measured = (
            (min(self.waits_s), statistics.median(self.waits_s), max(self.waits_s)) if self.waits_s else None
        )
        if first is None and measured is None:
            why = self.answer.refused if self.answer is not None and self.answer.refused else "not asked"
            return None, f"no queue wait measured and no start estimate ({why})"
        if first is None:
            assert measured is not None
            first, src = measured[1], "first job: the median measured wait (no start estimate)"
        else:
            src = f"first job: sbatch --test-only, asked {self.answer.asked_at}"  # type: ignore[union-attr]
        if measured is None:
            measured, later = (first, first, first), "later jobs: as the first (no wait measured)"
        else:
            later = f"later jobs: measured waits (n={len(self.waits_s)}, low/median/high)"
        max_job_s = 60.0 * self.max_time_min if self.max_time_min else None
        return QueueModel(first, measured, max_job_s), f"{src}; {later}"


def measured_waits(series: dict[str, list[tuple[int, float]]], runs: Sequence[Any]) -> dict[str, list[float]]:
    """Partition -> every queue wait its runs measured (`series`: run id -> (step, value) of
    `time/queue_wait_s`, from analysis.runs.fetch_series)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        values = [v for _, v in series.get(r.run_id, []) if math.isfinite(v) and v >= 0]
        if values:
            out.setdefault(r.partition, []).extend(values)
    return out


def partition_queues(rows: Sequence[Any], waits: dict[str, list[float]]) -> dict[str, PartitionQueue]:
    """Each candidate partition's queue from its runs' params and measured waits."""
    out: dict[str, PartitionQueue] = {}
    for row in rows:
        q = out.setdefault(row.partition, PartitionQueue(row.partition, list(waits.get(row.partition, []))))
        for r in row.runs:
            q.max_time_min = q.max_time_min or _int(r.param_float(MAX_TIME_PARAM))
            q.gpus_per_node = q.gpus_per_node or _int(r.param_float(GPUS_PER_NODE_PARAM))
            q.slurm_partition = q.slurm_partition or r.params.get(SLURM_PARTITION_PARAM) or None
            cluster = r.params.get(SLURM_CLUSTER_PARAM)
            q.slurm_cluster = q.slurm_cluster or (cluster if cluster and cluster != "None" else None)
    return out


def _int(v: float | None) -> int | None:
    return int(v) if v is not None and v >= 1 else None


def ask_each(queues: dict[str, PartitionQueue], gpus: int, wall_s: dict[str, float], ask: AskStart) -> None:
    """Ask every partition when a job of the production shape would start: the target's GPUs on
    whole nodes of the partition, for the projected wall time (its longest candidate there)
    bounded by its MaxTime (one job of the chain: the first). A partition none of whose
    candidates was projected is not asked: there is no time to result to put its answer in."""
    for name, q in queues.items():
        if name not in wall_s:
            continue
        if not q.slurm_partition or q.slurm_partition == "None":
            q.answer = StartAnswer("", refused="not a Slurm partition (partition.slurm_partition is null)")
            continue
        if not q.gpus_per_node:
            q.answer = StartAnswer(
                "", refused="the partition's GPUs per node are unknown (partition.gpus_per_node)"
            )
            continue
        q.nodes = math.ceil(gpus / q.gpus_per_node)
        minutes = max(1, math.ceil(wall_s[name] / 60))
        if q.max_time_min:
            minutes = min(minutes, q.max_time_min)
        where = [q.slurm_cluster] if q.slurm_cluster else []  # another cluster's partition: -M there
        q.answer = as_answer(ask(q.slurm_partition, q.nodes, q.gpus_per_node, minutes, *where))


@dataclass(frozen=True)
class CandidateTime:
    """One candidate's time to result: low, central, high, and what the queue model rests on."""

    candidate: str
    band: tuple[TimeToResult, TimeToResult, TimeToResult] | None
    source: str
    meets_deadline: bool | None = None

    @property
    def mid(self) -> TimeToResult | None:
        return self.band[1] if self.band else None


def candidate_time(
    candidate: str,
    walls_s: tuple[float, float, float],
    restart_s: float,
    queue: PartitionQueue,
    deadline_h: float | None,
) -> CandidateTime:
    model, source = queue.model()
    if model is None:
        return CandidateTime(candidate, None, source)
    band = time_to_result_band(walls_s, restart_s, model)
    meets = None if deadline_h is None else band[1].total_s <= deadline_h * 3600
    return CandidateTime(candidate, band, source, meets)


def _h(seconds: float) -> str:
    return "never" if not math.isfinite(seconds) else f"{seconds / 3600:,.1f} h"


def queue_rows(queues: dict[str, PartitionQueue]) -> list[list[str]]:
    """The report's table of partitions: measured waits, the production job's start estimate."""
    out = []
    for name, q in sorted(queues.items()):
        med = q.median_wait_s
        measured = (
            f"{med / 60:,.1f} min (n={len(q.waits_s)}, {min(q.waits_s) / 60:,.1f}-{max(q.waits_s) / 60:,.1f})"
            if med is not None
            else "none measured"
        )
        a = q.answer
        asked = (
            "not asked"
            if a is None
            else (f"starts in {_h(a.wait_s)}" if a.wait_s is not None else f"no estimate: {a.refused}")
        )
        shape = f"{q.nodes} node(s) x {q.gpus_per_node} GPUs" if q.nodes else "-"
        when = a.asked_at if a is not None and a.asked_at else "-"
        limit = f"{q.max_time_min / 60:,.1f} h" if q.max_time_min else "unknown"
        out.append([name, measured, shape, asked, when, limit])
    return out


QUEUE_HEADER = [
    "partition",
    "measured queue wait (median, n, range)",
    "production job",
    "its start",
    "asked at",
    "MaxTime",
]


def time_rows(times: Sequence[CandidateTime]) -> list[list[str]]:
    out = []
    for t in times:
        if t.band is None:
            out.append([t.candidate, "not estimated", "-", "-", "-", t.source])
            continue
        low, mid, high = t.band
        deadline = "" if t.meets_deadline in (None, True) else " (misses the deadline)"
        out.append(
            [
                t.candidate,
                _h(mid.total_s) + deadline,
                f"{_h(low.total_s)} - {_h(high.total_s)}",
                _h(mid.wait_s),
                f"{_h(mid.compute_s)} in {mid.jobs} job(s)",
                t.source,
            ]
        )
    return out


TIME_HEADER = ["candidate", "time to result", "band", "of which waiting", "computing", "queue model"]


def deadline_lines(
    times: Sequence[CandidateTime], costs: dict[str, float | None], deadline_h: float
) -> list[str]:
    """The candidates that miss the deadline, apart with their figures; the cheapest that meets it."""
    missed = [t for t in times if t.meets_deadline is False]
    lines = [
        f"{t.candidate}: misses the {deadline_h:g} h deadline: time to result {_h(t.mid.total_s)} "  # type: ignore[union-attr]
        f"({_h(t.mid.wait_s)} waiting, {_h(t.mid.compute_s)} computing)"  # type: ignore[union-attr]
        for t in missed
    ]
    meets = [t for t in times if t.meets_deadline and costs.get(t.candidate) is not None]
    if meets:
        best = min(meets, key=lambda t: costs[t.candidate] or 0.0)
        lines.append(
            f"The cheapest candidate that meets the {deadline_h:g} h deadline: {best.candidate} "
            f"(projected ${costs[best.candidate]:,.0f}, time to result {_h(best.mid.total_s)})"  # type: ignore[union-attr]
        )
    else:
        lines.append(f"No projected candidate meets the {deadline_h:g} h deadline.")
    return lines


def run_waits(
    runs: Sequence[Any], history: Callable[[list[Any]], dict[str, list[tuple[int, float]]]]
) -> dict[str, list[float]]:
    """Partition -> every queue wait its runs measured: a run's latest `time/queue_wait_s` is its
    only one unless it had several attempts; those runs' histories are fetched (`history`: one
    MLflow call per run, analysis.runs.fetch_series), so a sweep of thousands of single-attempt
    runs costs no extra call."""
    have = [r for r in runs if r.metric(K.TIME_QUEUE_WAIT_S) is not None]
    several = [r for r in have if (r.metric(K.ATTEMPTS) or 1) > 1]
    series = history(several) if several else {}
    for r in have:
        series.setdefault(r.run_id, [(0, float(r.metric(K.TIME_QUEUE_WAIT_S)))])
    return measured_waits(series, have)


def availability_section(
    rows: Sequence[Any],
    ranked: Sequence[tuple[Any, Any]],
    target: Any,
    queues: dict[str, PartitionQueue],
    ask: AskStart | None,
) -> tuple[Any, dict[str, str]]:
    """The report's "Availability and time to result" section, and the candidates the decision
    puts apart for the deadline (candidate -> why). `ranked`: (row, CandidateProjection) pairs
    of analysis.projection.projection_section."""
    from analysis import plots

    projected = [(row, p) for row, p in ranked if p.band is not None and p.run is not None]
    if ask is not None:
        longest: dict[str, float] = {}
        for row, p in projected:
            longest[row.partition] = max(longest.get(row.partition, 0.0), p.mid.wall_s)
        ask_each(queues, target.gpus, longest, ask)
    times = [
        candidate_time(
            row.candidate,
            (p.band[0].wall_s, p.band[1].wall_s, p.band[2].wall_s),
            p.run.restart_s,
            queues.get(row.partition, PartitionQueue(row.partition)),
            target.deadline_h,
        )
        for row, p in projected
    ]
    apart = _deadline_apart(times, projected, target.deadline_h)
    blocks: list[Any] = [
        AVAILABILITY_TEXT,
        plots.Table(QUEUE_HEADER, queue_rows(queues)),
        plots.Table(TIME_HEADER, time_rows(times))
        if times
        else "No candidate was projected: no time to result.",
    ]
    if target.deadline_h is not None:
        costs = {row.candidate: p.mid.cost_usd for row, p in projected}
        blocks.append(deadline_lines(times, costs, target.deadline_h))
    blocks.append(availability_plot(rows, queues))
    return plots.Section("Availability and time to result", blocks), apart


def _deadline_apart(
    times: Sequence[CandidateTime], projected: Sequence[tuple[Any, Any]], deadline_h: float | None
) -> dict[str, str]:
    """Candidates whose central time to result misses the deadline; where no queue figure exists,
    those whose projected compute time alone misses it."""
    if deadline_h is None:
        return {}
    out = {}
    by = {t.candidate: t for t in times}
    for row, p in projected:
        t = by.get(row.candidate)
        if t is not None and t.meets_deadline is False:
            out[row.candidate] = f"misses the {deadline_h:g} h deadline (time to result {_h(t.mid.total_s)})"  # type: ignore[union-attr]
        elif (t is None or t.band is None) and p.mid.wall_s > deadline_h * 3600:
            out[row.candidate] = f"misses the {deadline_h:g} h deadline on compute alone ({_h(p.mid.wall_s)})"
    return out


AVAILABILITY_TEXT = (
    "How long each partition makes a job wait, and when the production run would finish. Measured: every "
    f"allocation of this qualification's jobs logs its queue wait ({K.TIME_QUEUE_WAIT_S}: sacct Eligible -> "
    "Start, requeues included; none on the local launcher). Asked: when a job of the production shape (the "
    "target's GPUs on whole nodes, for the projected wall time bounded by the partition's MaxTime) would start "
    "(sbatch --test-only), with the date it was asked: a queue is a snapshot. Time to result = the first job's "
    "wait + the projected wall time, cut at MaxTime into chained jobs, each later one waiting as the measured "
    "waits (low, median, high: the band, with the wall time at half and twice the interruption rate) and paying "
    "a restart. docs/design.md, 'Time to result'."
)


def availability_plot(rows: Sequence[Any], queues: dict[str, PartitionQueue]) -> Any:
    """Median measured queue wait per partition (its range as a whisker) beside each candidate's
    cost per accepted output: the trade-off at a glance."""
    from matplotlib.figure import Figure

    from analysis import plots

    title = "Queue wait per partition beside cost per accepted output"
    waited = {n: q for n, q in sorted(queues.items()) if q.waits_s}
    costs = [(r.candidate, r.partition, r.per_finished_run) for r in rows if r.per_finished_run is not None]
    if not waited and not costs:
        return plots.Plot(
            "availability", title, None, "no queue wait was measured and no candidate has a cost"
        )
    fig = Figure(figsize=(11, 1.8 + 0.32 * max(len(costs), len(waited), 1)), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    names = list(waited)
    colour = {n: f"C{i % 10}" for i, n in enumerate(sorted({*names, *(p for _, p, _ in costs)}))}
    if names:
        med = [waited[n].median_wait_s or 0.0 for n in names]  # every listed partition has waits
        lo = [m - min(waited[n].waits_s) for m, n in zip(med, names, strict=True)]
        hi = [max(waited[n].waits_s) - m for m, n in zip(med, names, strict=True)]
        bars = ax1.barh(
            names,
            [m / 60 for m in med],
            xerr=[[v / 60 for v in lo], [v / 60 for v in hi]],
            color=[colour[n] for n in names],
        )
        # a measured 0 is labelled, so it never reads as a missing bar
        ax1.bar_label(bars, labels=[f"{m / 60:.1f} min" for m in med], padding=3, fontsize=8)
        ax1.margins(x=0.2)
        ax1.invert_yaxis()
    else:
        ax1.text(
            0.5, 0.5, "no queue wait measured\n(local launcher, or no job waited)", ha="center", va="center"
        )
    ax1.set_xlabel(f"queue wait, minutes (median, range; {K.TIME_QUEUE_WAIT_S})")
    if costs:
        ax2.barh([c for c, _, _ in costs], [v for _, _, v in costs], color=[colour[p] for _, p, _ in costs])
        ax2.invert_yaxis()
    ax2.set_xlabel("cost per accepted output, USD (per finished run)")
    fig.suptitle(title)
    missing = [n for n, q in sorted(queues.items()) if not q.waits_s]
    return plots.Plot(
        "availability",
        title,
        plots._png(fig),
        f"no wait measured on: {', '.join(missing)}" if missing else "",
    )
