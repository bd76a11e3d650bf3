"""What one attempt measures, in order: memory fit, precision support, the matmul ceiling,
collective bandwidth, the fine-tune itself, the final verified checkpoint, then the derived
numbers (DESIGN.md definitions) and the outcome."""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from pipeline import keys as K
from pipeline.comm import measure_collectives
from pipeline.cost import Attempt, BadputParts, CostParams, Price, goodput, run_cost
from pipeline.flops import (
    ModelShape,
    hardware_flops_per_token,
    mfu,
    model_flops_per_token,
    non_embedding_params,
    param_count,
)
from pipeline.metrics import measure_matmul_tflops, peak_memory_gib, reset_peak_memory, step_stats
from pipeline.trainer import (
    DTYPES,
    CheckpointDrill,
    StopFlag,
    Trainer,
    TrainResult,
    check_precision,
    run_dir_checkpoints,
)
from pipeline.validate import memory_estimate

if TYPE_CHECKING:
    from pipeline.job import Outcome, _Attempt

GIB = 2**30


def execute(a: _Attempt) -> Outcome:
    from pipeline.distributed import device_for, init_process_group
    from pipeline.job import Outcome, install_stop_handlers

    cfg, renv = a.cfg, a.renv
    torch.set_num_threads(max(1, cfg.partition.cpus_per_task))
    device = device_for(renv.local_rank)
    est = memory_estimate(cfg, on_gpu=device == "cuda")
    a.tracker.set_tags({K.TAG_MEM_VERDICT: est.verdict})
    a.log(
        {
            K.MEM_ESTIMATE_GIB: est.total_bytes / GIB,
            K.MEM_ESTIMATE_MODEL_STATES_GIB: est.model_states.device_bytes / GIB,
            K.MEM_ESTIMATE_ACTIVATIONS_GIB: est.activations_bytes / GIB,
            K.MEM_CAPACITY_GIB: est.capacity_bytes / GIB,
        }
    )
    if est.verdict == "does_not_fit" and cfg.train.skip_if_no_fit and device == "cuda":
        return Outcome(
            K.OUTCOME_FAILED,
            K.REASON_DOES_NOT_FIT,
            f"estimated {est.total_bytes / GIB:.1f} GiB per device of {est.capacity_bytes / GIB:.1f} GiB "
            f"(headroom {est.headroom_frac:.0%}, below 15%)",
        )
    if device == "cpu" and cfg.partition.is_gpu:
        print(
            f"[job] no GPU visible on {renv.hostname}: partition '{cfg.partition.name}' promises "
            f"{cfg.partition.gpu_type} GPUs, so this run trains on the CPU over gloo. CUDA memory, NCCL "
            "bandwidth and MFU against the datasheet peak are not measured; MFU is against a measured ceiling.",
            flush=True,
        )
    check_precision(cfg.precision)  # fp16 on a CPU ends here, cleanly, on every rank
    init_process_group(device, cfg.train.pg_timeout_s)

    if cfg.train.measure_ceiling:
        a.log({K.PERF_CEILING_TFLOPS: measure_matmul_tflops(device, DTYPES[cfg.precision.name])})
    if cfg.train.measure_comm and renv.world_size > 1:
        sizes = [int(mb * 1e6) for mb in cfg.train.comm_sizes_mb]
        comm = measure_collectives(sizes, iters=5, warmup=2, device=device)
        for op, key in (("all_reduce", K.COMM_ALLREDUCE_BUSBW), ("all_gather", K.COMM_ALLGATHER_BUSBW)):
            gbps = comm[op].plateau_busbw_gbps if op in comm else None
            if gbps is not None:
                a.log({key: gbps})

    stop = StopFlag()
    install_stop_handlers(stop)
    hooks = [CheckpointDrill(cfg.drill.checkpoint.at_step)] if cfg.drill.checkpoint.enabled else []
    trainer = Trainer(
        cfg.model,
        cfg.precision,
        cfg.parallelism,
        cfg.train,
        renv.rank,
        renv.world_size,
        device,
        run_dir_checkpoints(a.point_dir, cfg.train, renv.rank, renv.world_size),
        sink=a.tracker,
        hooks=hooks,
        stop=stop,
        client_state={"mlflow_run_id": getattr(a.tracker, "run_id", None)},
    )
    if renv.is_main:
        ds_path = a.point_dir / K.ARTIFACT_DS_CONFIG
        ds_path.write_text(json.dumps(trainer.ds_config, indent=1))
        a.tracker.log_artifact(ds_path)
    reset_peak_memory(device)
    res = trainer.setup()
    res = trainer.train()
    final = trainer.roundtrip(res.end_step) if not res.stopped else None
    _log_results(a, trainer, res, device)
    return _decide(a, trainer, res, final is not None and final.verified)


def _max_over_ranks(values: dict[str, float]) -> dict[str, float]:
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.tolist(), strict=True))


def _log_results(a: _Attempt, trainer: Trainer, res: TrainResult, device: str) -> None:
    cfg, renv = a.cfg, a.renv
    shape = ModelShape.of(cfg.model)
    world = renv.world_size
    m: dict[str, float] = {
        K.TRAIN_PARAMS: param_count(shape),
        K.TRAIN_NON_EMBEDDING_PARAMS: non_embedding_params(shape),
        K.PERF_MODEL_FLOPS_PER_TOKEN: model_flops_per_token(shape),
        K.TRAIN_STEPS: res.end_step,
        K.TRAIN_TOKENS: res.end_step * trainer.tokens_per_step,
        K.TRAIN_INITIAL_LOSS: math.log(cfg.model.vocab_size),
        K.TRAIN_LOSS_BOUND: cfg.train.loss_bound_frac * math.log(cfg.model.vocab_size),
    }
    if res.losses:
        last = [res.losses[s] for s in sorted(res.losses)[-3:]]
        m[K.TRAIN_FINAL_LOSS] = statistics.fmean(last)
    times = [res.step_times[s] for s in sorted(res.step_times)]
    stats = step_stats(times, cfg.train.warmup_steps)
    if stats is not None:
        tokens_per_s = trainer.tokens_per_step / stats.p50_s
        achieved = tokens_per_s * model_flops_per_token(shape) / world  # model FLOP/s per device
        hardware = (
            tokens_per_s * hardware_flops_per_token(shape, cfg.parallelism.activation_checkpointing) / world
        )
        m.update(
            {
                K.PERF_TOKENS_PER_S: tokens_per_s,
                K.PERF_STEP_P50_S: stats.p50_s,
                K.PERF_STEP_P95_S: stats.p95_s,
                K.PERF_STEP_CV: stats.cv,
                K.PERF_WARMUP_STEPS: stats.excluded_steps,
                K.PERF_TIMED_STEPS: stats.timed_steps,
                K.PERF_ACHIEVED_TFLOPS: achieved / 1e12,
            }
        )
        peak_tflops = cfg.partition.peak_tflops.get(cfg.precision.name) if device == "cuda" else None
        peak = peak_tflops * 1e12 if peak_tflops else None
        for key, value in ((K.PERF_MFU, mfu(achieved, peak)), (K.PERF_HFU, mfu(hardware, peak))):
            if value is not None:
                m[key] = value
        ceiling = a.metrics.get(K.PERF_CEILING_TFLOPS)
        if ceiling:
            m[K.PERF_MFU_VS_CEILING] = achieved / (ceiling * 1e12)

    mem = _max_over_ranks(peak_memory_gib(device))
    m[K.MEM_PEAK_RSS_GIB] = mem["rss"]
    used = mem.get("allocated", mem["rss"])
    a.tracker.set_tags({K.TAG_MEM_SOURCE: "cuda_max_allocated" if "allocated" in mem else "rss"})
    if "allocated" in mem:
        m[K.MEM_PEAK_ALLOCATED_GIB], m[K.MEM_PEAK_RESERVED_GIB] = mem["allocated"], mem["reserved"]
    capacity = a.metrics[K.MEM_CAPACITY_GIB]
    if capacity > 0:
        m[K.MEM_HEADROOM_FRAC] = 1.0 - used / capacity

    trips = res.roundtrips
    if trips:
        last_trip = trips[-1]
        m.update(
            {
                K.CKPT_SAVE_S: last_trip.save.seconds,
                K.CKPT_LOAD_S: last_trip.load.seconds,
                K.CKPT_BYTES: last_trip.save.bytes,
                K.CKPT_SAVE_GBPS: last_trip.save.gbps,
                K.CKPT_LOAD_GBPS: last_trip.load.gbps,
                K.CKPT_VERIFIED: float(last_trip.verified),
            }
        )
    saves = trainer.checkpoints.saves
    prior = _prior_attempts(a.point_dir)
    m[K.CKPT_SAVES] = len(saves) + sum(p.get("saves", 0) for p in prior)
    m[K.CKPT_VERIFIED_COUNT] = sum(t.verified for t in trips) + sum(p.get("verified", 0) for p in prior)
    m[K.CKPT_FALLBACKS] = res.load.fallbacks if res.load else 0
    m.update(_time_and_cost(a, trainer, res, prior, int(m[K.CKPT_BYTES]) if K.CKPT_BYTES in m else 0))
    a.log(m)


def _prior_attempts(point_dir: Path) -> list[dict[str, Any]]:
    path = point_dir / "attempts.json"
    return json.loads(path.read_text()) if path.exists() else []


def _time_and_cost(
    a: _Attempt, trainer: Trainer, res: TrainResult, prior: list[dict[str, Any]], ckpt_bytes: int
) -> dict[str, float]:
    """Goodput and cost of every attempt so far (this one included), written at its end."""
    cfg = a.cfg
    now = time.time()
    allocated = now - a.process_start
    startup = res.timeline.get("engine_ready", now) - a.process_start
    save_s = sum(s.seconds for s in trainer.checkpoints.saves)
    load_s = (res.load.seconds if res.load else 0.0) + sum(t.load.seconds for t in res.roundtrips)
    productive = sum(res.step_times.values())
    this = {
        "start": a.process_start,
        "end": now,
        "allocated_s": allocated,
        "productive_s": productive,
        "startup_s": startup,
        "save_s": save_s,
        "load_s": load_s,
        "saves": len(trainer.checkpoints.saves),
        "verified": sum(t.verified for t in res.roundtrips),
        "ranks": a.renv.world_size,
    }
    attempts = [*prior, this]
    if a.renv.is_main:
        tmp = a.point_dir / "attempts.json.tmp"
        tmp.write_text(json.dumps(attempts, indent=1))
        tmp.replace(a.point_dir / "attempts.json")
    total = {
        k: sum(float(x[k]) for x in attempts)
        for k in ("allocated_s", "productive_s", "startup_s", "save_s", "load_s")
    }
    g = goodput(
        total["productive_s"],
        total["allocated_s"],
        BadputParts(startup_s=total["startup_s"], ckpt_save_s=total["save_s"], restore_s=total["load_s"]),
    )
    out = {
        K.TIME_ALLOCATED_S: total["allocated_s"],
        K.TIME_PRODUCTIVE_S: total["productive_s"],
        K.TIME_STARTUP_S: total["startup_s"],
        K.TIME_CKPT_SAVE_S: total["save_s"],
        K.TIME_CKPT_LOAD_S: total["load_s"],
        K.TIME_IDLE_S: g.idle_s,
        K.ATTEMPTS: len(attempts),
    }
    if g.goodput is not None:
        out[K.GOODPUT] = g.goodput
    price = cfg.partition.price_usd_per_gpu_hour
    if price is not None:
        breakdown = run_cost(
            [Attempt(gpus=int(x["ranks"]), allocated_s=float(x["allocated_s"])) for x in attempts],
            Price(price, cfg.partition.price_date, cfg.partition.price_source),
            CostParams(**asdict(cfg.cost)),
            ckpt_bytes_stored=ckpt_bytes * cfg.train.keep_last,
            egress_bytes=0,
        )
        out.update(
            {
                K.COST_USD: breakdown.total,
                K.COST_COMPUTE_USD: breakdown.compute,
                K.COST_STORAGE_USD: breakdown.storage,
                K.COST_EGRESS_USD: breakdown.egress,
                K.COST_OVERHEAD_USD: breakdown.overhead,
                K.COST_LABOR_USD: breakdown.labor,
                K.COST_GPU_HOURS: breakdown.gpu_hours,
                K.COST_PRICE_USD_PER_GPU_HOUR: price,
            }
        )
    return out


def _decide(a: _Attempt, trainer: Trainer, res: TrainResult, final_verified: bool) -> Outcome:
    from pipeline.job import Outcome

    m = a.metrics
    if res.end_step < trainer.cfg.steps:
        return Outcome(
            K.OUTCOME_FAILED, K.REASON_TIMEOUT, f"stopped at step {res.end_step} of {trainer.cfg.steps}"
        )
    drill_trips = res.roundtrips[:-1]
    if not all(t.verified for t in drill_trips):
        return Outcome(
            K.OUTCOME_FAILED, K.REASON_DRILL_FAILED, "checkpoint drill: restored state hashes differ"
        )
    if not final_verified:
        return Outcome(
            K.OUTCOME_FAILED, K.REASON_CKPT_NOT_VERIFIED, "final checkpoint: restored state hashes differ"
        )
    final, bound = m.get(K.TRAIN_FINAL_LOSS, math.inf), m[K.TRAIN_LOSS_BOUND]
    if not final < bound:
        return Outcome(
            K.OUTCOME_FAILED,
            K.REASON_LOSS_BOUND,
            f"final loss {final:.4f} is not below the bound {bound:.4f}",
        )
    return Outcome(K.OUTCOME_ACCEPTED)
