"""Cost of a run from dated prices, cost per accepted output, and goodput.

Pure functions, used by the job (one run) and by analysis/ (a candidate's runs). Formulas are
docs/design.md's "Cost" and "Checkpoint and restart" sections (the seeds' cost formula). Money is in
USD, storage and egress in GB = 1e9 bytes (cloud price lists are per decimal GB), a month is
30 days. A ratio whose denominator is zero is "not defined": None, never 0 or an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

GB = 1e9
"""Bytes per GB in storage and egress prices."""
DAYS_PER_MONTH = 30.0


@dataclass(frozen=True)
class Price:
    """A dated price snapshot: reports show the date and the source next to every cost."""

    usd_per_gpu_hour: float
    date: str
    """ISO date the price was read, e.g. "2026-11-01"."""
    source: str
    """Where it was read: a price list URL, a contract, an internal chargeback rate."""


@dataclass(frozen=True)
class CostParams:
    """Everything but the GPU price. No defaults: every assumption is written in the config."""

    storage_usd_per_gb_month: float
    retention_days: float
    """How long checkpoints are kept."""
    egress_usd_per_gb: float
    orchestration_usd_per_run: float
    """Login-node, tracking server and scheduler share charged once per run (not per attempt)."""
    labor_usd_per_hour: float
    labor_hours_per_failure: float
    """Engineer time to diagnose and restart one failure that needs a person."""
    reusable_usd_per_verified_checkpoint: float = 0.0
    """Value of a checkpoint that passed restore verification and is kept for reuse (a warm
    start, an evaluation): subtracted from the cost. 0 unless a team states a value."""


@dataclass(frozen=True)
class BilledAttempt:
    """One Slurm allocation of a run: every attempt is paid for, accepted or not."""

    gpus: int
    allocated_s: float
    """Wall time of the allocation (sacct Elapsed), not only the time spent training."""
    needed_person: bool = False
    """True when the failure that ended it needed an engineer (not an automatic requeue)."""


@dataclass(frozen=True)
class CostBreakdown:
    """USD per part; gpu_hours = sum of GPUs * allocated hours."""

    compute: float
    storage: float
    egress: float
    overhead: float
    labor: float
    total: float
    gpu_hours: float
    reusable: float = 0.0
    """Value of the verified checkpoints, already subtracted in total."""


def _check_non_negative(**values: float) -> None:
    for name, v in values.items():
        if not v >= 0:  # also catches NaN
            raise ValueError(f"{name} must be >= 0, got {v}")


COST_DEFINITIONS: dict[str, str] = {
    "compute cost": "Σ allocations: GPUs (AllocTRES gres/gpu) × Elapsed hours × $/GPU-hour (dated partition price).",
    "storage cost": "$/GB-month × bytes of the checkpoints the point kept (what its retention left on disk) ÷ 1e9 "
    "× retention_days ÷ 30.",
    "egress cost": "$/GB × bytes of every checkpoint the point saved, when cost.ship_checkpoints is true; else 0.",
    "orchestration cost": "$ per run, once (not per attempt).",
    "labor cost": "engineer hours × $/hour, once for a point that ended with a failure that needed a person. "
    "An automatic requeue, a time limit, a preemption, a drill, the candidate's own limits and the tool's "
    "defects cost none.",
    "reusable value": "$ per checkpoint that passed restore verification, subtracted from the total "
    "(default 0: none claimed).",
    "total cost": "compute + storage + egress + orchestration + labor - reusable value.",
}
"""What each part of `run_cost` computes, in words: the report's Definitions show these (the
reasons that need a person are added there from pipeline.contract.outcome.NEEDS_PERSON), and
tests/unit/test_cost.py checks each against run_cost."""


def run_cost(
    attempts: Sequence[BilledAttempt],
    price: Price | None,
    params: CostParams,
    ckpt_bytes_stored: int,
    egress_bytes: int,
    verified_checkpoints: int = 0,
) -> CostBreakdown:
    """Cost of one run, all attempts (docs/design.md "Cost"):

    compute  = sum over attempts of GPUs * allocated hours * $/GPU-hour
    storage  = $/GB-month * GB of the checkpoints kept * retention_days / 30
    egress   = $/GB * egress GB
    overhead = orchestration $ per run
    labor    = engineer hours per failure * $/hour, for each attempt that needed a person
    reusable = $ per verified checkpoint * verified checkpoints
    total    = compute + storage + egress + overhead + labor - reusable

    A missing price raises ValueError: a cost without a price would be a guess. Callers that
    report on a partition with no price show "no price" for its cost columns.
    """
    if price is None:
        raise ValueError("no GPU price for this partition: its cost is not defined")
    _check_non_negative(
        usd_per_gpu_hour=price.usd_per_gpu_hour,
        ckpt_bytes_stored=ckpt_bytes_stored,
        egress_bytes=egress_bytes,
        verified_checkpoints=verified_checkpoints,
        **{f.name: getattr(params, f.name) for f in fields(params)},
    )
    for a in attempts:
        _check_non_negative(gpus=a.gpus, allocated_s=a.allocated_s)
    gpu_hours = sum(a.gpus * a.allocated_s / 3600 for a in attempts)
    compute = gpu_hours * price.usd_per_gpu_hour
    storage = (
        params.storage_usd_per_gb_month * ckpt_bytes_stored / GB * params.retention_days / DAYS_PER_MONTH
    )
    egress = params.egress_usd_per_gb * egress_bytes / GB
    overhead = params.orchestration_usd_per_run
    failures = sum(1 for a in attempts if a.needed_person)
    labor = failures * params.labor_hours_per_failure * params.labor_usd_per_hour
    reusable = verified_checkpoints * params.reusable_usd_per_verified_checkpoint
    total = compute + storage + egress + overhead + labor - reusable
    return CostBreakdown(compute, storage, egress, overhead, labor, total, gpu_hours, reusable)


def sum_costs(breakdowns: Sequence[CostBreakdown]) -> CostBreakdown:
    """Part-by-part sum, e.g. over a candidate's runs (accepted and failed alike)."""
    parts = [sum(getattr(b, f.name) for b in breakdowns) for f in fields(CostBreakdown)]
    return CostBreakdown(*parts)


def _ratio(numerator: float | None, denominator: float) -> float | None:
    if numerator is None or not denominator > 0:
        return None
    return numerator / denominator


def cost_per_finished_run(total_cost: float | None, accepted_runs: int) -> float | None:
    """Total cost of a candidate's runs / its accepted runs; None when none was accepted
    (or the cost is unknown): not defined, not zero."""
    return _ratio(total_cost, accepted_runs)


def cost_per_successful_checkpoint(total_cost: float | None, verified_checkpoints: int) -> float | None:
    """Total cost / checkpoints that passed restore verification; None when there are none."""
    return _ratio(total_cost, verified_checkpoints)


def tokens_per_dollar(accepted_tokens: float, total_cost: float | None) -> float | None:
    """Tokens of accepted runs / total cost (failed runs' cost counts, their tokens do not).
    None when the cost is unknown or zero; 0.0 when money was spent and nothing was accepted."""
    if total_cost is None:
        return None
    return _ratio(accepted_tokens, total_cost)


@dataclass(frozen=True)
class BadputParts:
    """Measured non-productive wall seconds of a run (summed over attempts). Zero when the
    phase did not happen."""

    startup_s: float = 0.0
    """Process start to engine ready: imports, init, engine construction."""
    ckpt_save_s: float = 0.0
    restore_s: float = 0.0
    """Checkpoint loads after a restart."""
    lost_work_s: float = 0.0
    """Step time of steps that were redone after a resume."""
    drills_s: float = 0.0
    """Injected faults: signal handling, waiting for the killed worker to be noticed."""


@dataclass(frozen=True)
class Goodput:
    goodput: float | None
    """productive / allocated, in [0, 1]; None when nothing was allocated."""
    productive_s: float
    allocated_s: float
    startup_s: float
    ckpt_save_s: float
    restore_s: float
    lost_work_s: float
    drills_s: float
    idle_s: float
    """The remainder: allocated - productive - measured parts, never negative (requeue waits
    inside the allocation, logging, evaluation, teardown)."""


def goodput(productive_s: float, allocated_s: float, breakdown: BadputParts) -> Goodput:
    """Goodput = productive step time / allocated time (docs/design.md, "Checkpoint and restart").

    Both in wall seconds of the run, summed over attempts: all devices of a run are allocated
    for the same wall time and step together, so the ratio is the same per device. The badput
    parts are measured independently; when they overlap or exceed the allocation (sacct's
    Elapsed has 1 s resolution) idle is 0, not negative, and goodput is capped at 1.
    """
    parts = {f.name: getattr(breakdown, f.name) for f in fields(breakdown)}
    _check_non_negative(productive_s=productive_s, allocated_s=allocated_s, **parts)
    idle = max(0.0, allocated_s - productive_s - sum(parts.values()))
    frac = min(1.0, productive_s / allocated_s) if allocated_s > 0 else None
    return Goodput(frac, productive_s, allocated_s, idle_s=idle, **parts)


J_PER_KWH = 3.6e6


def kwh(joules: float) -> float:
    return joules / J_PER_KWH


def energy_cost(it_kwh: float | None, usd_per_kwh: float | None, pue: float) -> float | None:
    """Energy cost, USD: the IT energy (GPUs, and hosts where measured) x PUE (the facility's
    overhead: cooling, power conversion) x the electricity price. None when either is unknown:
    an absent price or counter is never a cost of 0."""
    if it_kwh is None or usd_per_kwh is None:
        return None
    _check_non_negative(it_kwh=it_kwh, usd_per_kwh=usd_per_kwh)
    if pue < 1.0:
        raise ValueError(f"pue must be >= 1, got {pue}")
    return it_kwh * pue * usd_per_kwh


def energy_per_accepted_output(total_kwh: float | None, accepted_runs: int) -> float | None:
    """kWh of all runs of a candidate (failed ones included) per accepted run."""
    return _ratio(total_kwh, accepted_runs)
