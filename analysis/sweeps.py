"""One decision over several sweeps (`qualify report --sweeps A,B`, issue 36): typically one
sweep per cluster or provider, all in one MLflow store (one tracking server, or `qualify import`).

`combine` makes them one `Sweep` whose runs are addressed by their cluster: each run's candidate
becomes `<cluster>/<candidate>` and its partition `<cluster>/<partition>` (two clusters may both
have an `h100` partition), so every row of the report names its cluster and is ranked against
every other on the same measures; references still apply by the bare partition
(analysis/references.py). The cluster is the run's `sq.cluster` tag (its sweep's parent's for a
run without one; the sweep's id for sweeps recorded before clusters were, with a problem line).
`clusters_section` says which cluster ran which sweep, and the date of each price it used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from analysis import plots
from analysis.runs import RunRecord, Sweep
from pipeline.tracking import keys as K


def cluster_of(run: RunRecord, sweep: Sweep) -> str:
    return run.tag(K.TAG_CLUSTER) or sweep.parent.tag(K.TAG_CLUSTER) or f"sweep-{sweep.sweep_id}"


def combine(sweeps: Sequence[Sweep]) -> Sweep:
    """The sweeps as one, their runs addressed by cluster, their problems named by sweep."""
    runs: list[RunRecord] = []
    problems: list[str] = []
    for s in sweeps:
        unnamed = 0
        for r in s.runs:
            cluster = cluster_of(r, s)
            unnamed += not (r.tag(K.TAG_CLUSTER) or s.parent.tag(K.TAG_CLUSTER))
            tags = {
                **r.tags,
                K.TAG_CANDIDATE: f"{cluster}/{r.candidate}",
                K.TAG_PARTITION: f"{cluster}/{r.partition}",
            }
            runs.append(replace(r, tags=tags))
        if unnamed:
            problems.append(
                f"sweep {s.sweep_id}: {unnamed} run(s) name no cluster ({K.TAG_CLUSTER}: recorded before clusters "
                f"were); their rows are named sweep-{s.sweep_id}"
            )
        problems += [f"sweep {s.sweep_id}: {p}" for p in s.problems]
    first = sweeps[0]
    return Sweep(
        ",".join(s.sweep_id for s in sweeps),
        first.experiment_id,
        first.parent,
        runs,
        problems,
        parts=list(sweeps),
    )


def _price(r: RunRecord) -> str:
    p = r.price()
    return (
        f"{r.partition} no price"
        if p is None
        else f"{r.partition} ${p.usd_per_gpu_hour:.2f}/GPU-h dated {p.date} ({p.source})"
    )


def clusters_section(sweeps: Sequence[Sweep]) -> plots.Section:
    """One line per cluster of each sweep: its controller and Slurm version, its runs, and the
    dated price of each of its partitions (prices of different dates compare different markets)."""
    body = []
    dates: dict[str, set[str]] = {}
    for s in sweeps:
        by_cluster: dict[str, list[RunRecord]] = {}
        for r in s.runs:
            by_cluster.setdefault(cluster_of(r, s), []).append(r)
        for cluster, runs in sorted(by_cluster.items()):
            first = runs[0]
            controller = first.tag(K.TAG_CLUSTER_CONTROLLER) or s.parent.tag(K.TAG_CLUSTER_CONTROLLER) or "-"
            version = (
                first.tag(K.TAG_CLUSTER_SLURM_VERSION) or s.parent.tag(K.TAG_CLUSTER_SLURM_VERSION) or "-"
            )
            prices = sorted({_price(r) for r in runs})
            dates.setdefault(cluster, set()).update(p.date for r in runs if (p := r.price()) is not None)
            body.append([cluster, controller, version, s.sweep_id, str(len(runs)), "; ".join(prices)])
    said = [
        f"{cluster}: prices dated {', '.join(sorted(d))}" if d else f"{cluster}: no dated price"
        for cluster, d in sorted(dates.items())
    ]
    return plots.Section(
        "Clusters (one decision over several sweeps)",
        [
            plots.Table(
                ["cluster", "controller", "Slurm", "sweep", "runs", "prices (dated snapshots)"], body
            ),
            said,
            "Every candidate is named <cluster>/<partition>/...: each cluster's runs are costed at its own dated "
            "prices, and ranked with every other cluster's on the same measures. The sweeps ran the same workload "
            "(model config, method, data, seq_len, tokens per step: checked before this report was written).",
        ],
    )
