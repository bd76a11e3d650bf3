"""`qualify sweep ... sweep.adaptive=true`: adaptive qualification, its rule between rounds.

Round 1 is the sweep with one repeat of every point (`sweep.repeats` is the most repeats a
candidate may get). After each round, pipeline/measure/adaptive.py's `next_round` reads the
steady step-time windows of every accepted run of the candidates still in contention (from
each point's own ledger, `tracking/ledger.jsonl`: the series the job logged, MLflow or not)
and names those that get one more repeat: a new point of the same candidate with the next
seed, added to the same sweep folder, manifest and parent run, and run here. The rounds end
when one candidate is left, every contender has `sweep.repeats` runs, or the next round would
take the GPU-hours or dollars spent past sweep.budget_gpu_hours / sweep.budget_usd (each new
point counted at its candidate's mean measured cost). The parent run is tagged `sq.adaptive`
with the most repeats, so the report can state the full grid's GPU-hours next to those spent.

The local launcher runs the rounds here (`run_rounds`); on Slurm each round ends with a
controller job that makes the same decision (`decide`) and submits the next round
(pipeline/submit/controller.py): the login node only submits round 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config.compose import Point
from pipeline.config.resolved import config_from_yaml
from pipeline.config.schema import ConfigError
from pipeline.contract.outcome import Outcome
from pipeline.contract.pointdir import PointDir
from pipeline.contract.sweepdir import SweepDir
from pipeline.files import read_json
from pipeline.measure.adaptive import next_round
from pipeline.measure.steady import steady_window
from pipeline.submit.manifest import Manifest, PointEntry, parent_tracker
from pipeline.tracking import keys as K
from pipeline.tracking import store
from pipeline.tracking.ledger import EventKind, LedgerDir, LedgerEvent

log = logging.getLogger(__name__)
SEED = 20240617  # the bootstrap's seed between rounds (a rerun plans the same rounds)


def first_round(
    full: Any, sweep_name: str, overrides: Sequence[str], launcher: str | None, plan: Callable[..., Any]
) -> tuple[Any, int]:
    """The plan of round 1 (one repeat of every point) from the sweep's full plan `full`, and the
    most repeats a candidate may get; ConfigError (nothing submitted) where rounds cannot run."""
    cfg = full.points[0].cfg
    seeds = [o for o in overrides if o.partition("=")[0].lstrip("+") == "train.seed" and "," in o]
    problem = (
        "a seed list (train.seed=a,b,c) is a fixed grid: give sweep.repeats=N instead"
        if seeds or "train.seed" in cfg.sweep.grid
        else "sweep.repeats must be 2 or more: the most repeats a candidate may get"
        if cfg.sweep.repeats < 2
        else f"sweep.min_repeats={cfg.sweep.min_repeats} is more than sweep.repeats={cfg.sweep.repeats}"
        if cfg.sweep.min_repeats > cfg.sweep.repeats
        else ""
    )
    if problem:
        raise ConfigError(f"Invalid value for 'sweep.adaptive': true, but {problem}. Nothing was submitted.")
    return plan(sweep_name, [*overrides, "sweep.repeats=1"], launcher_kind=launcher), cfg.sweep.repeats


def step_series(entry: PointEntry) -> tuple[list[float], int]:
    """The point's perf/step_time_s by step (the last value logged for a step) and its warm-up."""
    by_step: dict[int, float] = {}
    warmup = 0
    path = LedgerDir(PointDir(entry.point_dir).tracking).ledger
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        try:
            ev = LedgerEvent.from_line(line)
        except (ValueError, KeyError):
            continue  # a line cut by a crash
        if ev.kind != EventKind.METRICS:
            continue
        if K.PERF_STEP_TIME_S in ev.data and ev.step is not None:
            by_step[int(ev.step)] = float(ev.data[K.PERF_STEP_TIME_S])
        if K.PERF_WARMUP_STEPS in ev.data:
            warmup = int(ev.data[K.PERF_WARMUP_STEPS])
    return [by_step[s] for s in sorted(by_step)], warmup


@dataclass
class Ledger:
    """What the rounds measured: per candidate, its accepted runs' windows and every run's cost."""

    windows: dict[str, list[np.ndarray]] = field(default_factory=dict)
    gpu_hours: dict[str, list[float]] = field(default_factory=dict)
    usd: dict[str, list[float]] = field(default_factory=dict)

    def spent(self, of: dict[str, list[float]]) -> float:
        return sum(sum(v) for v in of.values())


def measure(m: Manifest) -> Ledger:
    """Every point's steady window (accepted runs) and cost: Slurm's final bill (billed.json,
    sacct's allocations) where the login node or a controller made one, else the job's own."""
    out = Ledger()
    for entry in m.points:
        outcome = PointDir(entry.point_dir).read_outcome() or {}
        metrics = dict(outcome.get("metrics", {}))
        billed = read_json(PointDir(entry.point_dir).billed)
        if isinstance(billed, dict) and billed.get("source"):
            metrics.update({k: v for k, v in billed.items() if k in (K.COST_GPU_HOURS, K.COST_USD)})
        out.windows.setdefault(entry.candidate, [])
        for key, into in ((K.COST_GPU_HOURS, out.gpu_hours), (K.COST_USD, out.usd)):
            if metrics.get(key) is not None:
                into.setdefault(entry.candidate, []).append(float(metrics[key]))
        if outcome.get("outcome") != Outcome.ACCEPTED:
            continue
        times, warmup = step_series(entry)
        w = steady_window(times, warmup)
        if w is not None:
            out.windows[entry.candidate].append(np.asarray(w.steps))
    return out


def affordable(
    chosen: Sequence[str], got: Ledger, budget_gpu_hours: float | None, budget_usd: float | None
) -> bool:
    """Whether one more repeat of `chosen` keeps the spending within the budgets (each new point
    at its candidate's mean measured cost; a cost not measured cannot be checked and does not stop)."""
    for budget, of in ((budget_gpu_hours, got.gpu_hours), (budget_usd, got.usd)):
        if budget is None:
            continue
        more = sum(float(np.mean(of[c])) for c in chosen if of.get(c))
        if got.spent(of) + more > budget:
            return False
    return True


def repeat_point(m: Manifest, sweep_dir: Path, candidate: str) -> tuple[Point, PointEntry]:
    """A new point of `candidate`: its first point's config with the next unused seed."""
    import yaml

    from pipeline.config.resolved import drill_label

    mine = [e for e in m.points if e.candidate == candidate]
    first = mine[0]
    cfgs = [config_from_yaml(PointDir(e.point_dir).config.read_text()) for e in mine]
    seed = max(c.train.seed for c in cfgs) + 1
    tree = yaml.safe_load(PointDir(first.point_dir).config.read_text())
    tree["train"]["seed"] = seed
    text = yaml.safe_dump(tree, sort_keys=False)
    overrides = [o for o in first.overrides if o.partition("=")[0].lstrip("+") != "train.seed"]
    p = Point(len(m.points), [*overrides, f"train.seed={seed}"], config_from_yaml(text), text)
    entry = PointEntry(
        point_id=p.point_id,
        index=p.index,
        overrides=p.overrides,
        candidate=candidate,
        partition=first.partition,
        drills=drill_label(p.cfg),
        point_dir=str(SweepDir(sweep_dir).point(p.point_id).path),
        mem_verdict=first.mem_verdict,
    )
    return p, entry


@dataclass
class Rounds:
    rounds: int
    contenders: list[str]
    why: str  # why the rounds ended
    gpu_hours: float
    full_grid_gpu_hours: float | None


def full_grid(got: Ledger, candidates: Sequence[str], repeats: int) -> float | None:
    """GPU-hours of every candidate x `repeats` runs, each at its candidate's mean measured run."""
    if any(not got.gpu_hours.get(c) for c in candidates):
        return None
    return sum(float(np.mean(got.gpu_hours[c])) * repeats for c in candidates)


def tag_parent(m: Manifest, sweep_dir: Path, tags: dict[str, str], reopen: bool) -> Any:
    """Tag the parent run (and reopen it for a round: the round's last point closes it again)."""
    from pipeline.contract.parent import parent_lock

    offline = store.unreachable(m.tracking_uri) is not None
    with parent_lock(sweep_dir):
        if reopen:
            SweepDir(sweep_dir).parent_closed.unlink(missing_ok=True)
        parent = parent_tracker(m, sweep_dir, offline=offline)
        if reopen:
            parent.reopen()
        parent.set_tags(tags)
        parent.flush()
        parent.close(terminate=False)
    return parent


def add_points(m: Manifest, sweep_dir: Path, chosen: Sequence[str]) -> list[tuple[Point, PointEntry]]:
    """One new point per chosen candidate, appended to the manifest one by one (each takes the
    next index), its folder and inputs written."""
    pairs = []
    for c in chosen:
        p, entry = repeat_point(m, sweep_dir, c)
        m.points.append(entry)
        PointDir(entry.point_dir).write_inputs(p.yaml, p.overrides)
        pairs.append((p, entry))
    return pairs


def _run_round(m: Manifest, sweep_dir: Path, chosen: Sequence[str], on_result: Any, on_progress: Any) -> None:
    import os
    import socket

    from pipeline.submit.sweep import Plan, run_local

    pairs = add_points(m, sweep_dir, chosen)
    m.submit_pid, m.submit_host = os.getpid(), socket.gethostname()
    m.write(sweep_dir)
    parent = tag_parent(m, sweep_dir, {K.TAG_POINTS: str(len(m.points))}, reopen=True)
    run_local(
        Plan([p for p, _ in pairs], m.launcher, "adaptive", sweep_dir, m),
        pairs,
        parent,
        on_result,
        on_progress,
    )


@dataclass
class Decision:
    """What follows round k: one more repeat of `repeat`, or (repeat empty) the end, and why."""

    contenders: list[str]
    repeat: list[str]
    why: str  # why the rounds end ("" while they go on)
    got: Ledger


def decide(m: Manifest, alive: Sequence[str], max_repeats: int, k: int) -> Decision:
    """The rule after round k, from the points' ledgers and bills: the candidates of `alive`
    still in contention (all of them until each has sweep.min_repeats runs), and those of them
    that get one more repeat (none when the rounds end: one left, every contender at
    `max_repeats`, or the budget). The bootstrap's seed is
    (SEED, k): the local rounds and a Slurm controller (a fresh process each round) decide alike,
    and a controller run twice decides the same."""
    rng = np.random.default_rng([SEED, k])
    got = measure(m)
    first = config_from_yaml(PointDir(m.points[0].point_dir).config.read_text()).sweep
    nxt = next_round(
        {c: got.windows.get(c, []) for c in alive}, max_repeats, rng, min_repeats=first.min_repeats
    )
    if nxt.repeat and not affordable(nxt.repeat, got, first.budget_gpu_hours, first.budget_usd):
        why = "the next round would spend past sweep.budget_gpu_hours or sweep.budget_usd"
        return Decision(nxt.contenders, [], why, got)
    return Decision(
        nxt.contenders, nxt.repeat, "" if nxt.repeat else _why_ended(nxt.contenders, max_repeats), got
    )


def ended(d: Decision, rounds: int, candidates: Sequence[str], max_repeats: int) -> Rounds:
    got = d.got
    return Rounds(
        rounds, d.contenders, d.why, got.spent(got.gpu_hours), full_grid(got, candidates, max_repeats)
    )


def round_line(k: int, repeat: Sequence[str]) -> str:
    return f"[adaptive] round {k}: one more repeat of {len(repeat)} candidate(s) still in contention: {', '.join(repeat)}"


def run_rounds(
    sweep_dir: Path, max_repeats: int, on_result: Any = None, on_progress: Any = None, say: Any = print
) -> Rounds:
    """Round 1 has run (`qualify sweep`): plan and run the next rounds here until they end."""
    m = Manifest.read(sweep_dir)
    tag_parent(m, sweep_dir, {K.TAG_ADAPTIVE: str(max_repeats)}, reopen=False)
    candidates = list(dict.fromkeys(e.candidate for e in m.points))
    alive, rounds = candidates, 1
    while True:
        d = decide(m, alive, max_repeats, rounds)
        alive = d.contenders
        if not d.repeat:
            tags = {K.TAG_ADAPTIVE_ENDED: d.why, K.TAG_ADAPTIVE_ROUNDS: str(rounds)}
            tag_parent(m, sweep_dir, tags, reopen=False)
            return ended(d, rounds, candidates, max_repeats)
        rounds += 1
        say(round_line(rounds, d.repeat))
        _run_round(m, sweep_dir, d.repeat, on_result, on_progress)
        m = Manifest.read(sweep_dir)


def _why_ended(contenders: Sequence[str], max_repeats: int) -> str:
    if not contenders:
        return "no candidate has an accepted run with a steady window"
    if len(contenders) == 1:
        return "one candidate is left: its interval no longer overlaps any other's"
    return f"the candidates still in contention have {max_repeats} repeats each (sweep.repeats)"


def rounds_line(r: Rounds) -> str:
    full = (
        f"{r.full_grid_gpu_hours:.3g}"
        if r.full_grid_gpu_hours is not None
        else "not known (a run logged no cost)"
    )
    return (
        f"[adaptive] {r.rounds} round(s); ended: {r.why}; in contention: {', '.join(r.contenders) or 'none'}; "
        f"GPU-hours spent {r.gpu_hours:.3g}, the full grid would have spent {full}"
    )
