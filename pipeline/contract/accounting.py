"""Goodput and cost of a run over all its attempts (docs/design.md, "Goodput and badput"
and "Cost"): one record per attempt, and the totals over the records. Pure functions: the
records are kept in the point folder by `pipeline.job.entry` (`PointDir.append_attempt`)."""

from __future__ import annotations

import time
from dataclasses import fields, replace
from typing import Any

from pipeline.config.schema import Config
from pipeline.contract.outcome import NEEDS_PERSON, Outcome
from pipeline.contract.records import AttemptRecord
from pipeline.measure.cost import GB, BadputParts, BilledAttempt, CostParams, Price, goodput, run_cost
from pipeline.measure.timeline import Mark
from pipeline.sched import Allocation
from pipeline.tracking import keys as K

TIME_PARTS = ("allocated_s", "productive_s", "startup_s", "save_s", "load_s", "lost_s", "drills_s")


def attempt_record(
    process_start: float, ranks: int, trainer: Any = None, now: float | None = None
) -> AttemptRecord:
    """One attempt's times, from its process start to now (kept in attempts.json)."""
    now = time.time() if now is None else now
    rec = AttemptRecord(start=process_start, end=now, allocated_s=now - process_start, ranks=ranks)
    res = getattr(trainer, "result", None)
    if trainer is None or res is None:
        return rec
    return replace(
        rec,
        **resume_facts(res),
        productive_s=sum(res.step_times.values()),
        startup_s=res.timeline.get(Mark.ENGINE_READY, now) - process_start,
        save_s=sum(x.waited_s for x in trainer.checkpoints.saves),  # what the loop waited for
        load_s=(res.load.seconds if res.load else 0.0) + sum(t.load.seconds for t in res.roundtrips),
        drills_s=res.timeline.get(Mark.REFERENCE_S, 0.0) + res.timeline.get(Mark.PACED_S, 0.0),
        saves=len(trainer.checkpoints.saves),
        saved_bytes=sum(x.bytes for x in trainer.checkpoints.saves),
        verified=sum(t.verified for t in res.roundtrips),
        end_step=res.end_step,
    )


def resume_facts(res: Any) -> dict[str, Any]:
    """Where an attempt's run started and what it loaded (the drills' evidence reads them:
    pipeline.job.evidence.AttemptFacts)."""
    load = getattr(res, "load", None)
    return {
        "start_step": int(res.start_step),
        "loaded_step": int(load.step) if load is not None else None,
        "fallbacks": int(load.fallbacks) if load is not None else 0,
    }


def needed_person(outcome: str, reason: str) -> bool:
    """True when this ending is a failure that needs a person (labor is charged for it)."""
    return outcome == Outcome.FAILED and reason in NEEDS_PERSON


def billed_attempts(
    attempts: list[AttemptRecord], allocations: list[Allocation] | None
) -> tuple[list[BilledAttempt], str]:
    """What is paid for, and where its time comes from: Slurm's accounting when there is one
    (each allocation's ElapsedRaw x its gres/gpu, requeues included), else each attempt's own
    process clock x its ranks. The labor of a failure that needed a person goes with the last
    allocation (only the attempt that ends a point can fail for good)."""
    person = [bool(x.needed_person) for x in attempts]
    if not allocations:
        return [
            BilledAttempt(_ranks(x), _allocated_s(x), p) for x, p in zip(attempts, person, strict=True)
        ], K.ALLOCATED_PROCESS_CLOCK
    ranks = _ranks(attempts[-1]) if attempts else 0
    out = [BilledAttempt(a.gpus if a.gpus is not None else ranks, a.elapsed_s) for a in allocations]
    if any(person):
        out[-1] = BilledAttempt(out[-1].gpus, out[-1].allocated_s, needed_person=True)
    return out, K.ALLOCATED_SACCT


def _ranks(x: AttemptRecord) -> int:
    if x.ranks is None:
        raise ValueError(f"an attempt record without its ranks: {x.to_json()}")
    return int(x.ranks)


def _allocated_s(x: AttemptRecord) -> float:
    if x.allocated_s is None:
        raise ValueError(f"an attempt record without its allocated_s: {x.to_json()}")
    return float(x.allocated_s)


def run_totals(
    cfg: Config,
    attempts: list[AttemptRecord],
    ckpt_bytes_stored: int,
    allocations: list[Allocation] | None = None,
) -> tuple[dict[str, float], str]:
    """Time, goodput and cost of every attempt in `attempts` (the current one included), and
    where the allocated time came from (K.ALLOCATED_SACCT or K.ALLOCATED_PROCESS_CLOCK).
    `ckpt_bytes_stored`: the checkpoints the point really kept (job.retention), stored over the
    retention."""
    total = {k: sum(float(getattr(x, k) or 0.0) for x in attempts) for k in TIME_PARTS}
    total["productive_s"] -= total["lost_s"]
    billed, source = billed_attempts(attempts, allocations)
    total["allocated_s"] = sum(a.allocated_s for a in billed)  # wall time: every device waits alike
    out = _time_totals(total, measured=any(x.productive_s is not None for x in attempts))
    out[K.ATTEMPTS] = len(attempts)
    if cfg.partition.price_usd_per_gpu_hour is not None:
        out.update(_cost_totals(cfg, attempts, billed, ckpt_bytes_stored))
    return out, source


def _time_totals(total: dict[str, float], measured: bool) -> dict[str, float]:
    """The allocated time in parts, the idle rest and the goodput. Unless `measured` (no
    attempt got as far as a trainer: an unsupported precision, a crash in start-up) nothing
    trained (productive 0 is a fact), but how the time split into start-up, saves and the rest
    was never measured: those parts are absent, never 0."""
    g = goodput(
        total["productive_s"],
        total["allocated_s"],
        BadputParts(
            startup_s=total["startup_s"],
            ckpt_save_s=total["save_s"],
            restore_s=total["load_s"],
            lost_work_s=total["lost_s"],
            drills_s=total["drills_s"],
        ),
    )
    out = {K.TIME_ALLOCATED_S: total["allocated_s"], K.TIME_PRODUCTIVE_S: total["productive_s"]}
    if measured:
        out.update(
            {
                K.TIME_STARTUP_S: total["startup_s"],
                K.TIME_CKPT_SAVE_S: total["save_s"],
                K.TIME_CKPT_LOAD_S: total["load_s"],
                K.TIME_LOST_S: total["lost_s"],
                K.TIME_DRILLS_S: total["drills_s"],
                K.TIME_IDLE_S: g.idle_s,
            }
        )
    if g.goodput is not None:
        out[K.GOODPUT] = g.goodput
    return out


def _cost_totals(
    cfg: Config, attempts: list[AttemptRecord], billed: list[BilledAttempt], ckpt_bytes_stored: int
) -> dict[str, float]:
    """The bill of the run (pipeline.measure.cost.run_cost) at the partition's price."""
    price = cfg.partition.price_usd_per_gpu_hour
    assert price is not None
    shipped = sum(int(x.saved_bytes or 0) for x in attempts) if cfg.cost.ship_checkpoints else 0
    bill = run_cost(
        billed,
        Price(price, cfg.partition.price_date, cfg.partition.price_source),
        CostParams(**{f.name: getattr(cfg.cost, f.name) for f in fields(CostParams)}),
        ckpt_bytes_stored=ckpt_bytes_stored,
        egress_bytes=shipped,
        verified_checkpoints=sum(int(x.verified or 0) for x in attempts),
    )
    return {
        K.COST_USD: bill.total,
        K.COST_COMPUTE_USD: bill.compute,
        K.COST_STORAGE_USD: bill.storage,
        K.COST_EGRESS_USD: bill.egress,
        K.COST_EGRESS_GB: shipped / GB,
        K.COST_OVERHEAD_USD: bill.overhead,
        K.COST_LABOR_USD: bill.labor,
        K.COST_FAILURES_NEEDING_PERSON: sum(a.needed_person for a in billed),
        K.COST_REUSABLE_USD: bill.reusable,
        K.COST_GPU_HOURS: bill.gpu_hours,
        K.COST_PRICE_USD_PER_GPU_HOUR: price,
    }
