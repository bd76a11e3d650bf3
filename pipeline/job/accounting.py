"""Goodput and cost of a run over all its attempts (docs/design.md, "Goodput and badput"
and "Cost"): one record per attempt, and the totals over the records. Pure functions: the
records are kept in the point folder by `pipeline.job.entry` (`PointDir.append_attempt`)."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from pipeline.config.schema import Config
from pipeline.measure.cost import Attempt, BadputParts, CostParams, Price, goodput, run_cost
from pipeline.tracking import keys as K

TIME_PARTS = ("allocated_s", "productive_s", "startup_s", "save_s", "load_s", "lost_s", "drills_s")


def attempt_record(
    process_start: float, ranks: int, trainer: Any = None, now: float | None = None
) -> dict[str, Any]:
    """One attempt's times, from its process start to now (kept in attempts.json)."""
    now = time.time() if now is None else now
    rec: dict[str, Any] = {
        "start": process_start,
        "end": now,
        "allocated_s": now - process_start,
        "ranks": ranks,
    }
    res = getattr(trainer, "result", None)
    if trainer is None or res is None:
        return rec
    rec.update(
        productive_s=sum(res.step_times.values()),
        startup_s=res.timeline.get("engine_ready", now) - process_start,
        save_s=sum(x.seconds for x in trainer.checkpoints.saves),
        load_s=(res.load.seconds if res.load else 0.0) + sum(t.load.seconds for t in res.roundtrips),
        drills_s=res.timeline.get("reference_s", 0.0),
        saves=len(trainer.checkpoints.saves),
        verified=sum(t.verified for t in res.roundtrips),
        end_step=res.end_step,
    )
    return rec


def run_totals(cfg: Config, attempts: list[dict[str, Any]], ckpt_bytes: int) -> dict[str, float]:
    """Time, goodput and cost of every attempt in `attempts` (the current one included)."""
    total = {k: sum(float(x.get(k, 0.0)) for x in attempts) for k in TIME_PARTS}
    total["productive_s"] -= total["lost_s"]
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
    out = {
        K.TIME_ALLOCATED_S: total["allocated_s"],
        K.TIME_PRODUCTIVE_S: total["productive_s"],
        K.TIME_STARTUP_S: total["startup_s"],
        K.TIME_CKPT_SAVE_S: total["save_s"],
        K.TIME_CKPT_LOAD_S: total["load_s"],
        K.TIME_LOST_S: total["lost_s"],
        K.TIME_DRILLS_S: total["drills_s"],
        K.TIME_IDLE_S: g.idle_s,
        K.ATTEMPTS: len(attempts),
    }
    if g.goodput is not None:
        out[K.GOODPUT] = g.goodput
    price = cfg.partition.price_usd_per_gpu_hour
    if price is not None:
        bill = run_cost(
            [Attempt(gpus=int(x["ranks"]), allocated_s=float(x["allocated_s"])) for x in attempts],
            Price(price, cfg.partition.price_date, cfg.partition.price_source),
            CostParams(**{k: v for k, v in asdict(cfg.cost).items() if k in CostParams.__dataclass_fields__}),
            ckpt_bytes_stored=ckpt_bytes * cfg.train.keep_last,
            egress_bytes=0,
        )
        out.update(
            {
                K.COST_USD: bill.total,
                K.COST_COMPUTE_USD: bill.compute,
                K.COST_STORAGE_USD: bill.storage,
                K.COST_EGRESS_USD: bill.egress,
                K.COST_OVERHEAD_USD: bill.overhead,
                K.COST_LABOR_USD: bill.labor,
                K.COST_GPU_HOURS: bill.gpu_hours,
                K.COST_PRICE_USD_PER_GPU_HOUR: price,
            }
        )
    return out
