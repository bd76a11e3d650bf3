"""The report's energy, node-health and straggler columns, and a power and utilisation plot of
one run (docs/design.md, "Telemetry and energy", "Node health", "Straggler score")."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from analysis import plots
from analysis.runs import RunRecord
from analysis.table import Row
from pipeline.measure.cost import energy_per_accepted_output
from pipeline.tracking import keys as K


def energy_per_output(row: Row) -> tuple[float | None, str]:
    """(kWh of the GPUs over every finished run / accepted runs, why it is not defined)."""
    finished = [r for r in row.runs if r.finished]
    missing = [r for r in finished if r.metric(K.ENERGY_GPU_KWH) is None]
    if not finished:
        return None, "no finished run"
    if missing:
        note = missing[0].tag(K.TAG_ENERGY_NOTE) or "no GPU energy counter"
        return None, f"{len(missing)} of {len(finished)} finished run(s) without GPU energy ({note})"
    total = sum(r.metric(K.ENERGY_GPU_KWH) or 0.0 for r in finished)
    value = energy_per_accepted_output(total, row.accepted)
    return value, "" if value is not None else "0 accepted runs"


def energy_cost(row: Row) -> tuple[float | None, str]:
    """The candidate's energy cost over its finished runs, when a price (and counters) exist."""
    finished = [r for r in row.runs if r.finished]
    if finished and all(r.param_float("cost.electricity_usd_per_kwh") is None for r in finished):
        return None, "no electricity price (cost.electricity_usd_per_kwh)"
    costs = [r.metric(K.COST_ENERGY_USD) for r in finished]
    if not finished or any(c is None for c in costs):
        return None, "no GPU energy counter in every finished run"
    return sum(c or 0.0 for c in costs), ""


def node_verdicts(runs: Sequence[RunRecord]) -> str:
    """Each node's verdicts over the runs: 'h100-1: healthy x3; h100-2: failed x1 (...)'."""
    per: dict[str, Counter[str]] = {}
    detail: dict[str, str] = {}
    for r in runs:
        for key, value in r.tags.items():
            if key.startswith(K.TAG_HEALTH_NODE_PREFIX) and key != K.TAG_HEALTH_NOTES:
                node = key[len(K.TAG_HEALTH_NODE_PREFIX) :]
                verdict = value.split(":", 1)[0]
                per.setdefault(node, Counter())[verdict] += 1
                if ":" in value:
                    detail[node] = value.split(":", 1)[1].strip()
    if not per:
        return "not checked"
    parts = []
    for node in sorted(per):
        counts = ", ".join(f"{v} x{n}" for v, n in sorted(per[node].items()))
        parts.append(f"{node}: {counts}" + (f" ({detail[node][:120]})" if node in detail else ""))
    return "; ".join(parts)


def worst_node(runs: Sequence[RunRecord]) -> str:
    """The node most often slowest among the runs with a straggler score."""
    nodes = Counter(
        f"{r.tag(K.TAG_STRAGGLER_NODE)} (rank {r.tag(K.TAG_STRAGGLER_RANK)})"
        for r in runs
        if r.metric(K.PERF_STRAGGLER_SCORE) is not None and r.tag(K.TAG_STRAGGLER_NODE)
    )
    return nodes.most_common(1)[0][0] if nodes else "-"


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def energy_table(rows: Sequence[Row]) -> plots.Table:
    header = [
        "candidate", "kWh per accepted output", "energy cost", "mean GPU power W", "node verdicts",
        "straggler score", "slowest node",
    ]  # fmt: skip
    body = []
    for r in rows:
        per, why = energy_per_output(r)
        cost, cost_why = energy_cost(r)
        body.append([
            r.candidate, _num(per, ".4g") if per is not None else f"not defined ({why})",
            f"${cost:.4g}" if cost is not None else f"not defined ({cost_why})",
            _num(r.value(K.ENERGY_GPU_MEAN_POWER_W), ".0f"), node_verdicts(r.runs),
            _num(r.value(K.PERF_STRAGGLER_SCORE), ".2f"), worst_node(r.runs),
        ])  # fmt: skip
    return plots.Table(header, body)


def pick_run(rows: Sequence[Row]) -> RunRecord | None:
    """The run whose power is plotted: the first finished run with GPU telemetry, else with host
    telemetry."""
    runs = [r for row in rows for r in row.runs if r.finished]
    for want in ("/power_w", "/cpu_utilization_pct"):
        for r in runs:
            if any(k.startswith(K.SYS_PREFIX) and k.endswith(want) for k in r.metrics):
                return r
    return None


def power_plot(client: Any, rows: Sequence[Row]) -> plots.Plot:
    """Power (W) and utilisation (%) over time of every GPU (else host CPU) of one run."""
    run = pick_run(rows)
    if run is None:
        return plots.Plot("power", "Power and utilisation over time", None, "no run with telemetry")
    keys = sorted(k for k in run.metrics if k.startswith(K.SYS_PREFIX))
    power = [k for k in keys if k.endswith("/power_w")]
    util = [k for k in keys if k.endswith("/utilization_pct")] or [
        k for k in keys if k.endswith("/cpu_utilization_pct")
    ]
    series = {k: sorted(client.get_metric_history(run.run_id, k), key=lambda m: m.step) for k in power + util}
    t0 = min((h[0].step for h in series.values() if h), default=0)
    fig = plots._figure(4)
    groups = [(g, label) for g, label in ((power, "power W"), (util, "utilisation %")) if g]
    axes = fig.subplots(len(groups), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (group, label) in zip(axes, groups, strict=True):
        for k in group:
            h = series[k]
            ax.plot([(m.step - t0) / 1000 for m in h], [m.value for m in h], label=k[len(K.SYS_PREFIX) :])
        ax.set_ylabel(label)
        ax.legend(fontsize=6)
    axes[-1].set_xlabel("seconds since the first sample")
    note = f"run {run.name} ({run.candidate}); {len(power)} GPU power and {len(util)} utilisation series"
    if power:
        mean = statistics.fmean(m.value for k in power for m in series[k])
        note += f", mean sampled power {mean:.0f} W per GPU"
    return plots.Plot("power", "Power and utilisation over time", plots._png(fig), note)
