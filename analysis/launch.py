"""`qualify launch`: the winner's production job, derived from what its runs measured
(docs/design.md, "Launch"). This half reads the sweep through MLflow, picks the candidate,
projects it to `project.*` as the report does, refuses what its evidence cannot support, and
hands a `LaunchEvidence` to the writer the command passes in (pipeline/submit/launch.py: the
login node's files)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from analysis.confidence import candidate_spreads, drop_outliers_from_medians
from analysis.projection import CandidateProjection, Target, parse_target, project_candidate
from analysis.references import load_references
from analysis.runs import RunRecord, SweepNotFound, load_sweep
from analysis.scaling import series_runs
from analysis.table import Row, build_rows, recommend
from pipeline.contract.outcome import Outcome
from pipeline.measure.launch import LaunchEvidence, Sourced
from pipeline.tracking import keys as K
from pipeline.tracking.store import default_tracking_uri, missing_store

MAX_EXTRAPOLATION = 16
"""The largest target / largest measured size a projection is taken to: past it the scaling is a
guess (docs/design.md, "Projection": not modelled past the measured fabric). Only for a candidate
without a scaling series: with one, the series' own limit applies (`series_supports`)."""

Write = Callable[[LaunchEvidence, Path | None], int]
"""The writer: (the evidence, the runs folder the sweep is in, None: the project's) -> exit code."""


class Refused(Exception):
    """A request the evidence cannot support: one paragraph, exit code 2, nothing written."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qualify launch",
        description="Write the production job of a sweep's winner: runs/<sweep>/launch/<candidate>/.",
    )
    p.add_argument("--sweep", default=None, help="sweep id (default: the latest parent run)")
    p.add_argument("--candidate", default=None, help="candidate name (default: the report's winner)")
    p.add_argument("--smoke", type=int, default=None, metavar="N", help="cap at N steps and 1-2 nodes")
    p.add_argument(
        "--runs-dir", type=Path, default=None, help="the sweep's runs folder (default: the project's runs/)"
    )
    p.add_argument(
        "--tracking-uri", default=None, help="default: env MLFLOW_TRACKING_URI, else the project's SQLite"
    )
    p.add_argument("--experiment", default=K.EXPERIMENT, help="MLflow experiment name")
    p.add_argument("--references", default=None, help="references YAML (conf/references/)")
    p.add_argument(
        "target",
        nargs="*",
        help="project.tokens=2e10 (or project.steps=N) project.gpus=64 [project.global_batch=B "
        "project.rate_per_gpu_hour=R]",
    )
    return p


def launch_main(argv: list[str], write: Write) -> int:
    args = build_parser().parse_args(argv)
    try:
        evidence = gather(args)
    except Refused as e:
        print(f"launch: {e}", file=sys.stderr)
        return 2
    return write(evidence, args.runs_dir)


def _target(items: Sequence[str]) -> tuple[Target, int | None]:
    rest, batch = [], None
    for item in items:
        key, _, raw = item.partition("=")
        if key == "project.global_batch":
            try:
                batch = int(raw)
            except ValueError:
                raise Refused(f"'{item}': project.global_batch must be a whole number of sequences") from None
            if batch < 1:
                raise Refused(f"'{item}': project.global_batch must be >= 1")
        else:
            rest.append(item)
    try:
        target = parse_target(rest)
    except ValueError as e:
        raise Refused(str(e)) from None
    if target is None:
        raise Refused(
            "the production run is not given: say what it trains and on how many GPUs, e.g. "
            "project.tokens=2e10 project.gpus=64 (project.global_batch=512). Nothing was written."
        )
    return target, batch


def gather(args: argparse.Namespace) -> LaunchEvidence:
    if args.smoke is not None and args.smoke < 1:
        raise Refused(f"--smoke {args.smoke}: the smoke run's steps must be >= 1. Nothing was written.")
    target, batch = _target(args.target)
    uri = args.tracking_uri or default_tracking_uri()
    if missing := missing_store(uri):
        raise Refused(f"cannot read the sweep: {missing}. Nothing was written.")
    client = MlflowClient(tracking_uri=uri)
    try:
        sweep = load_sweep(client, args.experiment, args.sweep)
    except (SweepNotFound, MlflowException) as e:
        raise Refused(f"cannot read the sweep from {uri}: {e}. Nothing was written.") from None
    from analysis.report import default_references

    rows = build_rows(sweep, load_references(args.references or default_references()))
    spreads = candidate_spreads(client, rows, sweep.runs)
    drop_outliers_from_medians(rows, spreads)
    row = choose(rows, args.candidate, sweep.sweep_id)
    cs = spreads.get(row.candidate)
    step = (cs.spread.mean_s, *cs.spread.interval()) if cs is not None and cs.spread is not None else None
    price = row.price.usd_per_gpu_hour if row.price is not None else None
    cp = project_candidate(row.candidate, row.runs, target, price, step, series_runs(rows).get(row.candidate))
    accepted = [r for r in row.runs if r.tag(K.TAG_OUTCOME) == Outcome.ACCEPTED]
    why = series_supports(cp, target.gpus, [int(r.tag(K.TAG_GPUS) or 0) for r in accepted])
    if why:
        raise Refused(
            f"candidate {row.candidate}: the projection to {target.gpus} GPUs is outside what its runs "
            f"support: {why}. Qualify it at a size nearer the target (a scaling series, "
            "parallelism.nodes=1,2), or ask for fewer GPUs. Nothing was written."
        )
    return _evidence(sweep.sweep_id, sweep.parent.run_id, row, accepted, cp, target, batch, args.smoke)


def choose(rows: Sequence[Row], name: str | None, sweep_id: str) -> Row:
    """The named candidate, or the report's one winner; refused without an accepted run."""
    if name is None:
        winners = [(m, r) for m, (r, _) in recommend(rows).items() if r is not None]
        if len(winners) != 1:
            names = ", ".join(r.candidate for r in rows) or "none"
            raise Refused(
                f"sweep {sweep_id} has {len(winners)} recommended candidates (one per model); name the one to "
                f"launch with --candidate (its candidates: {names}). Nothing was written."
            )
        return winners[0][1]
    mine = [r for r in rows if r.candidate == name]
    if not mine:
        names = ", ".join(r.candidate for r in rows) or "none"
        raise Refused(
            f"sweep {sweep_id} has no candidate {name!r} (its candidates: {names}). Nothing was written."
        )
    row = mine[0]
    if not any(r.tag(K.TAG_OUTCOME) == Outcome.ACCEPTED for r in row.runs):
        raise Refused(
            f"candidate {name} has no accepted run in sweep {sweep_id} ({row.outcome_text()}): nothing it "
            "measured says the production job would run. Launch a candidate that passed. Nothing was written."
        )
    return row


def series_supports(cp: CandidateProjection, target_gpus: int, measured_gpus: Sequence[int]) -> str:
    """Why the projection is outside what its runs support ('' when it is not): no projection,
    an infinite wall time, a scaling series that refuses the target (analysis/series.py: its
    compute per rank changed beyond the noise, or no network was measured or stated past one
    node; the projection's input `do_not_extrapolate_beyond_gpus`), or, with no series, a target
    more than MAX_EXTRAPOLATION times the largest size measured."""
    if cp.mid is None:
        return cp.note or "no projection could be made"
    if not math.isfinite(cp.mid.wall_s):
        return "the expected wall time is infinite (interruptions outpace the checkpoints)"
    if "do_not_extrapolate_beyond_gpus" in cp.inputs:
        beyond, why = cp.inputs["do_not_extrapolate_beyond_gpus"]
        return f"its scaling series supports at most {beyond:g} GPUs ({why})"
    largest = max(measured_gpus, default=0)
    if largest < 1:
        return "its accepted runs do not say how many GPUs they ran on (tag sq.gpus)"
    if "scaling_measured" not in cp.inputs and target_gpus > MAX_EXTRAPOLATION * largest:
        return (
            f"{target_gpus} GPUs is {target_gpus / largest:g} times the largest size measured ({largest}), "
            f"past the {MAX_EXTRAPOLATION}x this tool projects to without a scaling series"
        )
    return ""


def _median_run(runs: Sequence[RunRecord], key: str) -> RunRecord:
    """The accepted run with the median value of `key` (the first when none has it)."""
    has = sorted((r for r in runs if r.metric(key) is not None), key=lambda r: r.metric(key) or 0.0)
    return has[len(has) // 2] if has else runs[0]


def stop_save(runs: Sequence[RunRecord], accepted: Sequence[RunRecord]) -> Sourced:
    """The slowest save at a stop the candidate's runs measured (the preempt drill's signal to
    the saved exit), else the slowest checkpoint save of its accepted runs (assumed alike)."""
    stops = [(v, r.run_id) for r in runs if (v := r.metric(K.RESTART_SIGNAL_TO_EXIT_S)) is not None]
    if stops:
        v, i = max(stops)
        return Sourced(
            v, f"measured in run {i}: {K.RESTART_SIGNAL_TO_EXIT_S} (the preempt drill's signal to saved exit)"
        )
    saves = [(v, r.run_id) for r in accepted if (v := r.metric(K.CKPT_SAVE_S)) is not None]
    if not saves:
        return Sourced(
            0.0, "assumed 0: no save was measured (the grace is then the step alone, at least a minute)"
        )
    v, i = max(saves)
    return Sourced(
        v,
        f"assumed: the slowest checkpoint save measured (run {i}, {K.CKPT_SAVE_S}); no preempt drill measured a stop",
    )


def _evidence(
    sweep_id: str,
    parent_id: str,
    row: Row,
    accepted: list[RunRecord],
    cp: CandidateProjection,
    target: Target,
    batch: int | None,
    smoke: int | None,
) -> LaunchEvidence:
    run = _median_run(accepted, K.PERF_STEP_P50_S)
    mb_searched = run.metric(K.SEARCH_MICRO_BATCH)
    mb = (
        Sourced(mb_searched, f"searched in run {run.run_id} (search/micro_batch, with search.headroom)")
        if mb_searched is not None
        else Sourced(
            float(run.params.get("parallelism.micro_batch", "1")),
            f"the micro-batch run {run.run_id} trained at (parallelism.micro_batch; not searched)",
        )
    )
    stop = stop_save(row.runs, accepted)
    step = run.metric(K.PERF_STEP_P50_S) or 0.0
    gpus = int(run.tag(K.TAG_GPUS) or 1)
    micro = int(float(run.params.get("parallelism.micro_batch", "1")))
    accum = int(float(run.params.get("parallelism.grad_accum", "1")))
    band = cp.band
    assert band is not None and cp.mid is not None
    return LaunchEvidence(
        sweep_id=sweep_id,
        candidate=row.candidate,
        run_id=run.run_id,
        point_id=run.tag(K.TAG_POINT_ID),
        accepted_runs=tuple(r.run_id for r in accepted),
        parent_run_id=parent_id,
        gpus=target.gpus,
        tokens=target.tokens,
        steps=target.steps,
        global_batch=batch,
        smoke_steps=smoke,
        inputs=dict(cp.inputs),
        interval_s=cp.mid.interval_s if cp.run is not None and cp.run.mtbi_s is not None else None,
        wall_s=(band[0].wall_s, band[1].wall_s, band[2].wall_s),
        cost_usd=None if cp.price is None else tuple(p.cost_usd or 0.0 for p in band),  # type: ignore[arg-type]
        cost_band=(cp.spread.low, cp.spread.high) if cp.spread is not None else None,
        price=cp.price,
        proven_micro_batch=mb,
        stop_save_s=stop,
        qualified_step_s=Sourced(step, f"measured in run {run.run_id}: perf/step_time_p50_s"),
        qualified_gpus=gpus,
        qualified_global_batch=micro * accum * gpus,
    )
