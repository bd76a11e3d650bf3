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
- an interrupting drill (preempt, kill_worker, timeout, reshape) adds one restart; with
  drill.reference, a replay of the whole run (steps and a start-up again).
- GPU-hours = wall x ranks / 3600; dollars = GPU-hours x the partition's dated price; the local
  launcher's wall time = the sum of the points' / launcher.local_parallelism.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

EFFICIENCY = 0.40
CPU_RATE_TFLOPS = 0.0134
STARTUP_S = 60.0
LOCAL_STARTUP_S = 15.0
WARN_GPU_HOURS = 100.0
WARN_LOCAL_WALL_S = 1800.0
INTERRUPTING = ("preempt", "kill_worker", "timeout", "reshape")


@dataclass
class Estimate:
    points: int = 0
    gpu_hours: float = 0.0
    usd: float = 0.0
    wall_s: float = 0.0  # the local launcher's wall time on this machine
    local: bool = True
    unpriced: int = 0
    no_step_time: list[str] = field(default_factory=list)


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


def point_wall_s(cfg: Any, local: bool) -> tuple[float, bool]:
    """(seconds the point holds its ranks, whether its step time was predicted)."""
    start = LOCAL_STARTUP_S if local else STARTUP_S
    step = step_time_s(cfg)
    drills = [d for d in INTERRUPTING if getattr(getattr(cfg.drill, d, None), "enabled", False)]
    runs = 1 + (1 if drills and cfg.drill.reference else 0)
    wall = runs * (start + cfg.train.steps * (step or 0.0)) + len(drills) * start
    return wall, step is not None


def estimate(points: Sequence[Any]) -> Estimate:
    """The sweep's estimate over its composed points (pipeline.config.compose.Point)."""
    est = Estimate(points=len(points))
    est.local = not any(p.cfg.partition.slurm_partition for p in points)
    for p in points:
        cfg = p.cfg
        wall, predicted = point_wall_s(cfg, est.local)
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
    line = f"estimate: {est.points} points, {est.gpu_hours:,.3g} {unit}, {_usd(est.usd)}"
    if est.local:
        line += f", about {est.wall_s / 60:,.1f} min on this machine (local launcher)"
    lines = [line + " (pipeline/submit/estimate.py; docs/design.md, 'What the qualification costs')"]
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

    est = estimate(points)
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
    est = estimate(points)
    sweep = points[0].cfg.sweep if points else None
    why = over_budget(est, getattr(sweep, "budget_usd", None), getattr(sweep, "budget_gpu_hours", None))
    return describe(est) + (
        f"\n{why.replace('nothing was submitted', 'qualify sweep would refuse it')}" if why else ""
    )
