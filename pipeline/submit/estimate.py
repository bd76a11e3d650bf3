"""What a sweep will cost before it runs: points, GPU-hours (rank-hours on CPU), dollars and,
for the local launcher, the wall time on this machine. Pure functions over composed points
(docs/design.md, "What the qualification costs").

Per point: steps x a predicted step time, plus one start-up per attempt, plus the drills'
extra attempts and their reference replays:

- step time = model FLOPs per token (6N + attention, pipeline.measure.flops) x tokens per
  optimizer step / (ranks x rate); rate = the partition's datasheet peak for the precision x
  `EFFICIENCY` (Llama 3 reports 38-43% BF16 MFU on H100: Dubey et al. 2024, table 4); on a
  partition without a peak (a CPU), `CPU_RATE_TFLOPS` per rank, measured on the development
  machine (the tiny model's fp32 default point: 42,083 tokens/s on 2 ranks x 638,976 FLOPs per
  token = 0.0134 TFLOP/s per rank). An adapter point is charged as a full fine-tune (an upper
  bound: its backward computes no weight gradients of the frozen base). A model whose shape
  pipeline.measure.flops cannot read (a described family) gets no step-time estimate: its
  steps are left out of the figure and the estimate says so.
- start-up: `STARTUP_S` per attempt (Slurm: job start to first step) or `LOCAL_STARTUP_S` per
  point on the local launcher (the default 7-point sweep takes about two minutes on 2 cores).
- a drill that starts ranks again (pipeline.drills: `DrillSpec.restarts`, the interrupting
  ones and reshape) adds one restart; with drill.reference, a replay of the whole run (steps
  and a start-up again). A drill that paces its run (`DrillSpec.step_floor`: the time-out
  drill's step_floor_s) charges each of the run's steps at least that floor; the replay is not
  paced.
- baseline: where the project's SQLite store holds accepted runs of the point's candidate
  (tag sq.candidate), the point's time is theirs instead: the median of (time/allocated_s -
  train/steps x perf/step_time_p50_s) as its fixed part, plus the point's steps x the median
  p50 step time. Only a SQLite store is read (a server could keep `show` waiting).
- GPU-hours = wall x ranks / 3600; dollars = GPU-hours x the partition's dated price; the local
  launcher's wall time = the sum of the points' / launcher.local_parallelism.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.contract.outcome import Outcome
from pipeline.drills import restarting, step_floor_s

EFFICIENCY = 0.40
CPU_RATE_TFLOPS = 0.0134
STARTUP_S = 60.0
LOCAL_STARTUP_S = 15.0
WARN_GPU_HOURS = 100.0
WARN_LOCAL_WALL_S = 1800.0


BASELINE_RUNS = 2000
"""Accepted runs read at most for the baseline (one search_runs page, newest first)."""


@dataclass(frozen=True)
class Baseline:
    """A candidate's earlier accepted runs: their fixed seconds per point and step time."""

    fixed_s: float
    step_s: float
    runs: int


@dataclass
class Estimate:
    points: int = 0
    gpu_hours: float = 0.0
    usd: float = 0.0
    wall_s: float = 0.0  # the local launcher's wall time on this machine
    local: bool = True
    unpriced: int = 0
    no_step_time: list[str] = field(default_factory=list)
    from_baseline: int = 0  # points timed from their candidate's earlier runs


def step_time_s(cfg: Any) -> float | None:
    """Predicted seconds per optimizer step; None when the model's FLOPs are not known here."""
    from pipeline.measure.flops import ModelShape, model_flops_per_token

    try:
        flops = model_flops_per_token(ModelShape.of(cfg.model))
    except (ValueError, TypeError, AttributeError, KeyError):
        return None
    p = cfg.parallelism
    ranks = max(p.world_size, 1)
    tokens = p.micro_batch * p.grad_accum * cfg.model.seq_len * ranks
    peak = (cfg.partition.peak_tflops or {}).get(cfg.precision.name)
    rate = peak * EFFICIENCY if peak else CPU_RATE_TFLOPS
    return float(flops * tokens / (ranks * rate * 1e12))


def point_wall_s(cfg: Any, local: bool, baseline: Baseline | None = None) -> tuple[float, bool]:
    """(seconds the point holds its ranks, whether its step time was predicted)."""
    if baseline is not None:
        return baseline.fixed_s + cfg.train.steps * baseline.step_s, True
    start = LOCAL_STARTUP_S if local else STARTUP_S
    step = step_time_s(cfg)
    drills = restarting(cfg.drill)
    replays = 1 if drills and cfg.drill.reference else 0
    run_step = max(step or 0.0, step_floor_s(cfg.drill))
    wall = start + cfg.train.steps * run_step + replays * (start + cfg.train.steps * (step or 0.0))
    return wall + len(drills) * start, step is not None


def estimate(points: Sequence[Any], baselines: dict[str, Baseline] | None = None) -> Estimate:
    """The sweep's estimate over its composed points (pipeline.config.compose.Point)."""
    from pipeline.config.resolved import candidate_name

    est = Estimate(points=len(points))
    est.local = not any(p.cfg.partition.slurm_partition for p in points)
    for p in points:
        cfg = p.cfg
        base = (baselines or {}).get(candidate_name(cfg))
        est.from_baseline += base is not None
        wall, predicted = point_wall_s(cfg, est.local, base)
        if not predicted:
            est.no_step_time.append(p.point_id)
        hours = wall * max(cfg.parallelism.world_size, 1) / 3600
        est.gpu_hours += hours
        est.wall_s += wall
        price = cfg.partition.price_usd_per_gpu_hour
        if price is None:
            est.unpriced += 1
        else:
            est.usd += hours * price
    if est.local and points:
        est.wall_s /= max(points[0].cfg.launcher.local_parallelism, 1)
    return est


def _usd(v: float) -> str:
    return f"${v:,.2f}" if v >= 1 else f"${v:.3g}"


def describe(est: Estimate) -> str:
    """The lines printed by `qualify show`, `qualify fit` and the start of `qualify sweep`."""
    unit = "rank-hours" if est.local else "GPU-hours"
    line = f"estimate: {est.points} point{'' if est.points == 1 else 's'}, {est.gpu_hours:,.3g} {unit}, {_usd(est.usd)}"
    if est.local:
        line += f", about {est.wall_s / 60:,.1f} min on this machine (local launcher)"
    lines = [line + " (pipeline/submit/estimate.py; docs/design.md, 'What the qualification costs')"]
    if est.from_baseline:
        lines.append(
            f"  {est.from_baseline} of {est.points} point(s) timed from their candidate's earlier runs"
        )
    if est.unpriced:
        lines.append(f"  {est.unpriced} point(s) have no price: their dollars are not counted")
    if est.no_step_time:
        lines.append(
            f"  {len(est.no_step_time)} point(s) have no step-time prediction (start-up only counted)"
        )
    if est.gpu_hours > WARN_GPU_HOURS or (est.local and est.wall_s > WARN_LOCAL_WALL_S):
        lines.append(
            "warning: a large qualification; narrow the grid, or cap it with sweep.budget_usd / "
            "sweep.budget_gpu_hours"
        )
    return "\n".join(lines)


def over_budget(est: Estimate, budget_usd: float | None, budget_gpu_hours: float | None) -> str | None:
    """One paragraph when the estimate is over a budget; None when within (or no budget)."""
    over = []
    if budget_usd is not None and est.usd > budget_usd:
        over.append(f"{_usd(est.usd)} against sweep.budget_usd={budget_usd:g}")
    if budget_gpu_hours is not None and est.gpu_hours > budget_gpu_hours:
        over.append(f"{est.gpu_hours:,.3g} GPU-hours against sweep.budget_gpu_hours={budget_gpu_hours:g}")
    if not over:
        return None
    return (
        f"The sweep's estimate is over its budget ({'; '.join(over)}): nothing was submitted. Narrow the grid "
        "(qualify show lists the points), lower train.steps, or raise the budget."
    )


def check_budget(points: Sequence[Any]) -> Estimate:
    """The estimate; raises ConfigError (exit 2) when it is over sweep.budget_*."""
    from pipeline.config.schema import ConfigError

    est = estimate(points, load_baselines(points))
    sweep = points[0].cfg.sweep if points and hasattr(points[0].cfg, "sweep") else None
    why = over_budget(est, getattr(sweep, "budget_usd", None), getattr(sweep, "budget_gpu_hours", None))
    if why:
        raise ConfigError(why)
    return est


def sweep_estimate(points: Sequence[Any]) -> str:
    """describe(check_budget(points)): the lines to print, or ConfigError over a budget."""
    return describe(check_budget(points))


def show_estimate(points: Sequence[Any]) -> str:
    """For `qualify show`: the estimate, and the refusal a sweep would meet, without raising."""
    est = estimate(points, load_baselines(points))
    sweep = points[0].cfg.sweep if points else None
    why = over_budget(est, getattr(sweep, "budget_usd", None), getattr(sweep, "budget_gpu_hours", None))
    return describe(est) + (
        f"\n{why.replace('nothing was submitted', 'qualify sweep would refuse it')}" if why else ""
    )


def baselines_from(runs: Sequence[tuple[str, float, float, float]]) -> dict[str, Baseline]:
    """(candidate, allocated s, steps, p50 step s) of accepted runs -> each candidate's Baseline."""
    import statistics

    by: dict[str, list[tuple[float, float]]] = {}
    for cand, allocated, steps, p50 in runs:
        by.setdefault(cand, []).append((max(allocated - steps * p50, 0.0), p50))
    return {
        c: Baseline(statistics.median(f for f, _ in v), statistics.median(s for _, s in v), len(v))
        for c, v in by.items()
    }


def load_baselines(points: Sequence[Any]) -> dict[str, Baseline]:
    """Earlier accepted runs of the sweep's candidates from its SQLite store (none elsewhere,
    or when the store is absent or unreadable: the estimate then says nothing came from it)."""
    from pipeline.tracking import keys as K
    from pipeline.tracking.store import missing_store, resolve_uri

    if not points:
        return {}
    uri = resolve_uri(points[0].cfg.tracking.uri)
    if not uri.startswith("sqlite:///") or missing_store(uri):
        return {}
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        exp = client.get_experiment_by_name(points[0].cfg.tracking.experiment)
        if exp is None:
            return {}
        filt = f"tags.`{K.TAG_PARENT_KIND}` = 'point' and tags.`{K.TAG_OUTCOME}` = '{Outcome.ACCEPTED}'"
        found = client.search_runs(
            [exp.experiment_id], filt, max_results=BASELINE_RUNS, order_by=["attributes.start_time DESC"]
        )
    except Exception:  # noqa: BLE001 - a store we cannot read gives no baseline, never a failed show
        return {}
    rows = []
    for r in found:
        m, cand = r.data.metrics, r.data.tags.get(K.TAG_CANDIDATE, "")
        values = (m.get(K.TIME_ALLOCATED_S), m.get(K.TRAIN_STEPS), m.get(K.PERF_STEP_P50_S))
        if cand and all(v is not None for v in values):
            rows.append((cand, *values))
    return baselines_from(rows)  # type: ignore[arg-type]
