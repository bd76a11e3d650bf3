"""`make baseline SWEEP=<id>`: references from a sweep's accepted runs.

After a driver, firmware or library change, the next qualification is judged against what
this sweep measured: each metric's median over the accepted runs of a scope, with a tolerance
on the side that matters (a throughput may fall by at most the tolerance, a time may rise by
at most it). The file is commented YAML in the references format (analysis/references.py),
with the base file's generic bars (e.g. ckpt/verified) copied in so it stands alone.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from analysis.references import Reference, load_references
from analysis.runs import RunRecord, Sweep, SweepNotFound, load_sweep
from pipeline.home import conf_dir, project_home
from pipeline.tracking import keys as K
from pipeline.tracking.store import default_tracking_uri, missing_store

log = logging.getLogger(__name__)

# key -> (higher is better, unit). Spread (step-time CV) and memory are not baselined: they
# are quality bars and capacity, set by hand in conf/references/default.yaml.
BASELINE_METRICS: dict[str, tuple[bool, str]] = {
    K.PERF_TOKENS_PER_S: (True, "tokens/s"),
    K.PERF_MFU: (True, "fraction"),
    K.PERF_MFU_VS_CEILING: (True, "fraction"),
    K.PERF_STEP_P50_S: (False, "s"),
    K.COMM_ALLREDUCE_BUSBW: (True, "GB/s"),
    K.COMM_ALLGATHER_BUSBW: (True, "GB/s"),
    K.CKPT_SAVE_S: (False, "s"),
    K.CKPT_LOAD_S: (False, "s"),
    K.RESTART_TOTAL_S: (False, "s"),
    K.GOODPUT: (True, "fraction"),
}
SCOPES = {
    "precision": lambda r: f"{r.partition}/{r.model}/{r.precision}",
    "candidate": lambda r: f"{r.partition}/{r.model}/{r.precision}/{r.parallelism}",
}


@dataclass(frozen=True)
class Entry:
    reference: Reference
    runs: int
    """Accepted runs the median is taken over."""


def build_baseline(
    sweep: Sweep, tolerance: float, per_metric: dict[str, float] | None = None, by: str = "precision"
) -> dict[str, list[Entry]]:
    """Scope -> one entry per metric that its accepted runs report (median, tolerance)."""
    per_metric = per_metric or {}
    groups: dict[str, list[RunRecord]] = {}
    for r in sweep.runs:
        if r.accepted:
            groups.setdefault(SCOPES[by](r), []).append(r)
    out: dict[str, list[Entry]] = {}
    for scope, runs in sorted(groups.items()):
        for metric, (higher_better, unit) in BASELINE_METRICS.items():
            values = [v for r in runs if (v := r.metric(metric)) is not None]
            if not values:
                continue
            tol = per_metric.get(metric, tolerance)
            value = float(f"{statistics.median(values):.4g}")
            lower, upper = (-tol, None) if higher_better else (None, tol)
            out.setdefault(scope, []).append(
                Entry(Reference(metric, value, lower, upper, unit, scope), len(values))
            )
    return out


def _flow(ref: Reference) -> str:
    # yaml.safe_dump writes floats YAML reads back as floats (1.0e-05, not the string 1e-05)
    return yaml.safe_dump([ref.value, ref.lower, ref.upper, ref.unit], default_flow_style=True).strip()


def format_baseline(
    sweep: Sweep,
    entries: dict[str, list[Entry]],
    base: list[Reference],
    base_source: str,
    tolerance: float,
    by: str,
) -> str:
    lines = [
        f"# Baseline references from sweep {sweep.sweep_id} (parent run {sweep.parent.run_id}),",
        f"# written {time.strftime('%Y-%m-%d %H:%M %Z')} by `make baseline`: the median of each metric over the",
        f"# accepted runs of each scope ({'partition/model/precision' if by == 'precision' else 'one candidate'}),",
        f"# tolerance {tolerance:.0%} on the side that matters (throughput may fall, times may rise by it).",
        "# Format: [value, lower, upper, unit], lower/upper fractions of value, null = unbounded",
        "# (see conf/references/default.yaml). Judge a new sweep with",
        "#   make report ARGS='--references <this file>'",
        "references:",
    ]
    if base:
        lines.append(f"  # copied from {base_source}")
        for scope in sorted({r.scope for r in base}):
            lines.append(f'  "{scope}":')
            lines += [f"    {r.metric}: {_flow(r)}" for r in base if r.scope == scope]
    for scope, items in entries.items():
        lines.append(f'  "{scope}":')
        lines += [
            f"    {e.reference.metric}: {_flow(e.reference)}  # median of {e.runs} run(s)" for e in items
        ]
    return "\n".join(lines) + "\n"


def _tolerance_for(text: str) -> tuple[str, float]:
    key, _, frac = text.partition("=")
    try:
        return key, float(frac)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected KEY=FRACTION, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qualify baseline", description="References from a sweep's accepted runs."
    )
    p.add_argument("--sweep", default=None, help="sweep id (default: the latest parent run)")
    p.add_argument(
        "--tolerance", type=float, default=0.10, help="fraction a metric may worsen (default 0.10)"
    )
    p.add_argument(
        "--tolerance-for",
        type=_tolerance_for,
        action="append",
        default=[],
        metavar="KEY=FRAC",
        help="per metric",
    )
    p.add_argument(
        "--by",
        choices=sorted(SCOPES),
        default="precision",
        help="scope of each median: partition/model/precision (default; mixes parallelisms) or one candidate",
    )
    p.add_argument("--base", type=Path, default=None, help="bars to copy")
    p.add_argument("--out", type=Path, default=None, help="default conf/references/baseline-<sweep_id>.yaml")
    p.add_argument(
        "--tracking-uri", default=None, help="default: env MLFLOW_TRACKING_URI, else the project's SQLite"
    )
    p.add_argument("--experiment", default=K.EXPERIMENT, help="MLflow experiment name")
    return p


def baseline_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.tolerance < 1:
        print(f"baseline: --tolerance must be in [0, 1), got {args.tolerance}", file=sys.stderr)
        return 2
    uri = args.tracking_uri or default_tracking_uri()
    if missing := missing_store(uri):
        print(f"baseline: cannot read the sweep: {missing}", file=sys.stderr)
        return 2
    client = MlflowClient(tracking_uri=uri)
    try:
        sweep = load_sweep(client, args.experiment, args.sweep)
    except (SweepNotFound, MlflowException) as e:
        print(f"baseline: cannot read the sweep: {e}", file=sys.stderr)
        return 2
    entries = build_baseline(sweep, args.tolerance, dict(args.tolerance_for), args.by)
    if not entries:
        print(
            f"baseline: sweep {sweep.sweep_id} has no accepted run with metrics: nothing to write",
            file=sys.stderr,
        )
        return 1
    base_refs = load_references(args.base or conf_dir() / "references" / "default.yaml")
    base = [r for scope in base_refs.scopes.values() for r in scope.values()]
    out = args.out or project_home() / "conf" / "references" / f"baseline-{sweep.sweep_id}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(format_baseline(sweep, entries, base, base_refs.source, args.tolerance, args.by))
    n = sum(len(v) for v in entries.values())
    print(f"baseline: {n} references in {len(entries)} scopes from sweep {sweep.sweep_id} -> {out}")
    for problem in sweep.problems + base_refs.problems:
        log.warning("note: %s", problem)
    return 0


if __name__ == "__main__":
    sys.exit(baseline_main(sys.argv[1:]))
