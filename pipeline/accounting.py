"""Goodput and cost of a run over all its attempts (DESIGN.md "Checkpoint and restart" and
"Cost"), kept in the point's attempts.json and logged at the end of every attempt."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import keys as K
from pipeline.cost import Attempt, BadputParts, CostParams, Price, goodput, run_cost

if TYPE_CHECKING:
    from pipeline.job import _Attempt
    from pipeline.trainer import Trainer, TrainResult


def prior_attempts(point_dir: Path) -> list[dict[str, Any]]:
    path = point_dir / "attempts.json"
    return json.loads(path.read_text()) if path.exists() else []


def time_and_cost(
    a: _Attempt,
    trainer: Trainer,
    res: TrainResult,
    prior: list[dict[str, Any]],
    ckpt_bytes: int,
    restart: Any = None,
) -> dict[str, float]:
    """Goodput and cost of every attempt so far (this one included), written at its end."""
    cfg = a.cfg
    this = attempt_record(a, trainer, res)
    if restart is not None and res.step_times:
        # the steps the previous attempt did after its last checkpoint were done again here
        this["lost_s"] = restart.lost_steps * statistics.median(res.step_times.values())
    attempts = [*prior, this]
    if a.renv.is_main:
        append_attempt(a.point_dir, this)
    total = {
        k: sum(float(x.get(k, 0.0)) for x in attempts)
        for k in ("allocated_s", "productive_s", "startup_s", "save_s", "load_s", "lost_s", "drills_s")
    }
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
            CostParams(**asdict(cfg.cost)),
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


def attempt_record(a: _Attempt, trainer: Trainer | None, res: TrainResult | None) -> dict[str, Any]:
    """This attempt's times, for the cost and goodput of the run (kept in attempts.json)."""
    now = time.time()
    rec: dict[str, Any] = {
        "start": a.process_start,
        "end": now,
        "allocated_s": now - a.process_start,
        "ranks": a.renv.world_size,
    }
    if trainer is None or res is None:
        return rec
    rec.update(
        productive_s=sum(res.step_times.values()),
        startup_s=res.timeline.get("engine_ready", now) - a.process_start,
        save_s=sum(x.seconds for x in trainer.checkpoints.saves),
        load_s=(res.load.seconds if res.load else 0.0) + sum(t.load.seconds for t in res.roundtrips),
        drills_s=res.timeline.get("reference_s", 0.0),
        saves=len(trainer.checkpoints.saves),
        verified=sum(t.verified for t in res.roundtrips),
        end_step=res.end_step,
    )
    return rec


def append_attempt(point_dir: Path, rec: dict[str, Any]) -> None:
    attempts = [*prior_attempts(point_dir), rec]
    tmp = point_dir / "attempts.json.tmp"
    tmp.write_text(json.dumps(attempts, indent=1))
    tmp.replace(point_dir / "attempts.json")
