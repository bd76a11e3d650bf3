"""What one attempt measures, in order: memory fit, precision support, the matmul ceiling,
collective bandwidth, the fine-tune itself, the final verified checkpoint, then the derived
numbers (defined in docs/design.md, "The numbers") and the outcome."""

from __future__ import annotations

import json
import math
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from pipeline.config.pretrained import described
from pipeline.config.validate import memory_estimate, memory_query, search_capacity_bytes
from pipeline.files import write_atomic
from pipeline.job.accounting import attempt_record, resume_facts
from pipeline.job.attempt import AttemptContext, AttemptEnd, AttemptStopped
from pipeline.job.drills import (
    DrillVerdict,
    KillWorkerDrill,
    PreemptDrill,
    StopRecord,
    breakdown,
    is_peer_failure,
)
from pipeline.job.evidence import AttemptFacts, KillRecord, missing_evidence
from pipeline.job.gpu import check_partition, inventory
from pipeline.job.observe import Observer
from pipeline.job.reshape import ReshapeDrill, ReshapePoint, reshape_on_main_rank, wait_for_result
from pipeline.job.results import Quality, classify, decide, target_metrics
from pipeline.job.search import Trial, limit_cpu_memory, search, vm_bytes
from pipeline.job.spec import Outcome
from pipeline.job.startup import import_deepspeed, node_startup, node_tags
from pipeline.measure.flops import (
    ModelShape,
    hardware_flops_per_token,
    mfu,
    model_flops_per_token,
    non_embedding_params,
)
from pipeline.measure.memory import largest_micro_batch
from pipeline.measure.stats import step_stats
from pipeline.tracking import keys as K
from pipeline.train.checkpoint import CheckpointManager, LoadStats, SaveStats, step_of, tag_for
from pipeline.train.probes import (
    free_device_memory,
    measure_collectives,
    measure_matmul_tflops,
    peak_memory_gib,
    reset_peak_memory,
)
from pipeline.train.progress import DRILL, FINISHING, STARTING
from pipeline.train.trainer import (
    DTYPES,
    CheckpointDrill,
    DistComm,
    RoundTrip,
    StopFlag,
    Trainer,
    TrainResult,
    check_precision,
    checkpoint_group,
    run_dir_checkpoints,
)

GIB = 2**30


class _Run:
    """The runner's working state for one attempt: its context and what it builds."""

    def __init__(self, ctx: AttemptContext) -> None:
        self.ctx = ctx
        self.cfg, self.renv, self.spec, self.point = ctx.cfg, ctx.renv, ctx.spec, ctx.point
        self.stop, self.process_start, self.prev_stop = ctx.stop, ctx.process_start, ctx.prev_stop
        self.prior = list(ctx.prior)
        self.tracker = ctx.tracker
        self.metrics = ctx.log.values
        self.trainer: Trainer | None = None  # set once built, so a failure can still say what it knows
        self.gpu_mismatch: str | None = None  # the GPU is not the partition's type
        self.record: dict[str, Any] | None = None  # this attempt's record, once its results are in
        self.observer = Observer(ctx)  # node health gate, telemetry, stragglers
        self.startup: dict[str, float] = {}  # import_s, process_group_s (then the trainer's parts)
        self.preempt: PreemptDrill | None = None  # the preempt drill, when it is on

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.ctx.log.log(metrics, step)

    def attempt_record(self) -> dict[str, Any]:
        return self.record or attempt_record(self.process_start, self.renv.world_size, self.trainer)


def execute(ctx: AttemptContext) -> AttemptEnd:
    """Run the attempt to its outcome; raise AttemptStopped when it must be requeued. Any other
    exception is the point's failure (the entry classifies it)."""
    a = _Run(ctx)
    try:
        outcome = _execute(a)
    except AttemptStopped:
        raise
    except Exception as e:
        if a.trainer is not None and classify(e)[1] == K.REASON_CRASH and is_peer_failure(e):
            raise AttemptStopped(_peer_failure_record(a, e), a.attempt_record()) from e
        raise
    return AttemptEnd(outcome, a.attempt_record())


def _peer_failure_record(a: _Run, exc: BaseException) -> StopRecord:
    """Another rank died mid-step (the kill_worker drill, or a real node failure): the run goes
    on from the last checkpoint in the next attempt."""
    trainer = a.trainer
    assert trainer is not None
    print(f"[job] rank {a.renv.rank}: a peer failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    kill = a.point.read_kill()
    tags = trainer.checkpoints.tags()
    return StopRecord(
        reason="peer_failure",
        signal_time=float(kill["time"]) if kill else time.time(),
        exit_time=0.0,
        stop_step=trainer.result.end_step,
        saved_step=step_of(tags[0]) if tags else 0,
        trigger=f"rank {kill['rank']} killed" if kill else type(exc).__name__,
        attempt=len(a.prior),
        dead_rank=int(kill["rank"]) if kill else None,
        detected_time=time.time(),
    )


def _execute(a: _Run) -> Outcome:
    from pipeline.job.distributed import device_for, init_process_group

    import_deepspeed(logs=a.renv.is_main and a.cfg.tracking.enabled)  # here: its import is timed as such

    a.startup["import_s"] = time.time() - a.process_start
    cfg, renv = a.cfg, a.renv
    torch.set_num_threads(max(1, cfg.partition.cpus_per_task))
    device = device_for(renv.local_rank)
    est = _log_estimate(a, device)
    if est.verdict == "does_not_fit" and cfg.train.skip_if_no_fit and device == "cuda":
        return Outcome(
            K.OUTCOME_FAILED,
            K.REASON_DOES_NOT_FIT,
            f"estimated {est.total_bytes / GIB:.1f} GiB per device of {est.capacity_bytes / GIB:.1f} GiB "
            f"(headroom {est.headroom_frac:.0%}, below 15%)",
        )
    gpus, note = inventory()
    a.gpu_mismatch = (
        check_partition(gpus, cfg.partition.gpu_type, renv.local_rank) if device == "cuda" else None
    )
    gpu = gpus[renv.local_rank % len(gpus)] if gpus and device == "cuda" else None
    a.tracker.set_tags(
        {
            K.TAG_DEVICE: f"cuda:{gpu.name}" if gpu else "cpu",
            K.TAG_GPU_DRIVER: f"{gpu.driver} (CUDA {gpu.cuda_driver})" if gpu else note,
            **({K.TAG_GPU_MISMATCH: a.gpu_mismatch} if a.gpu_mismatch else {}),
        }
    )
    if a.gpu_mismatch:
        print(f"[job] {a.gpu_mismatch}; no MFU against the partition's datasheet peak", flush=True)
    if device == "cpu" and cfg.partition.is_gpu:
        print(
            f"[job] no GPU visible on {renv.hostname}: partition '{cfg.partition.name}' promises "
            f"{cfg.partition.gpu_type} GPUs, so this run trains on the CPU over gloo. CUDA memory, NCCL "
            "bandwidth and MFU against the datasheet peak are not measured; MFU is against a measured ceiling.",
            flush=True,
        )
    check_precision(cfg.precision)  # fp16 on a CPU ends here, cleanly, on every rank
    a.ctx.progress.phase(
        STARTING, "the process group (DeepSpeed's comm op is compiled here if it was not built at install)"
    )
    t0 = time.perf_counter()
    init_process_group(device, cfg.train.pg_timeout_s)
    a.startup["process_group_s"] = time.perf_counter() - t0

    if cfg.search.micro_batch:
        a.ctx.progress.phase(STARTING, "the micro-batch search")
        found = _search_micro_batch(a, device)
        if found is not None:
            return found
    a.ctx.progress.phase(STARTING, "probes: matmul ceiling, collectives, node health")

    ceiling = None
    if cfg.train.measure_ceiling:
        ceiling = measure_matmul_tflops(device, DTYPES[cfg.precision.name])
        a.log({K.PERF_CEILING_TFLOPS: ceiling})
    if cfg.train.measure_comm and renv.world_size > 1:
        sizes = [int(mb * 1e6) for mb in cfg.train.comm_sizes_mb]
        comm = measure_collectives(sizes, iters=5, warmup=2, device=device)
        for op, key in (("all_reduce", K.COMM_ALLREDUCE_BUSBW), ("all_gather", K.COMM_ALLGATHER_BUSBW)):
            gbps = comm[op].plateau_busbw_gbps if op in comm else None
            if gbps is not None:
                a.log({key: gbps})
    unhealthy = a.observer.gate(device, ceiling, a.metrics.get(K.COMM_ALLREDUCE_BUSBW))
    if unhealthy is not None:
        a.record = a.observer.with_record(attempt_record(a.process_start, renv.world_size))
        return unhealthy

    stop: StopFlag = a.stop
    first = a.ctx.first
    hooks: list[Any] = []
    if cfg.drill.checkpoint.enabled:
        hooks.append(CheckpointDrill(cfg.drill.checkpoint.at_step))
    if cfg.drill.preempt.enabled:
        a.preempt = PreemptDrill(cfg.drill, renv, first, a.ctx.slurm)
        hooks.append(a.preempt)
    if cfg.drill.kill_worker.enabled:
        hooks.append(KillWorkerDrill(cfg.drill, renv, a.point, first))
    if cfg.drill.reshape.enabled:
        hooks.append(ReshapeDrill(cfg.drill.reshape.at_step))
    hooks.extend(a.observer.step_hooks(device))
    a.observer.start_telemetry()
    if (
        cfg.drill.interrupting() or cfg.drill.reshape.enabled
    ) and cfg.drill.reference:  # a reference run follows
        a.ctx.progress.expect(drill_steps=cfg.train.steps)
    trainer = a.trainer = _build_trainer(
        a,
        device,
        run_dir_checkpoints(a.point.path, cfg.train, renv.rank, renv.world_size),
        sink=a.tracker,
        hooks=hooks,
        client_state={"mlflow_run_id": getattr(a.tracker, "run_id", None)},
        in_step_hooks=a.observer.in_step_hooks(),
        progress=a.ctx.progress,
    )
    _probe_data(a, trainer)
    if renv.is_main:
        ds_path = a.point.ds_config
        write_atomic(ds_path, json.dumps(trainer.ds_config, indent=1))
        a.tracker.log_artifact(ds_path)
    reset_peak_memory(device)
    res = trainer.setup()
    _log_startup(a, res)
    if cfg.drill.reshape.enabled and res.start_step >= cfg.drill.reshape.at_step:
        return _finish_reshaped(a, trainer, device)  # an earlier attempt got there
    try:
        res = trainer.train()
    except ReshapePoint:
        return _finish_reshaped(a, trainer, device)
    if res.stopped:
        _log_results(a, trainer, res, device)
        raise AttemptStopped(_stop_record(a, trainer, res, stop), a.attempt_record())
    _log_model_states(a, trainer, device)
    final = trainer.roundtrip(res.end_step)
    try:
        verdict = _verify_drills(a, trainer, res, device)
    except AttemptStopped:  # stopped while the reference run was under way: it resumes too
        _log_results(a, trainer, res, device)
        raise
    _log_results(a, trainer, res, device)
    return decide(res, trainer.cfg.steps, a.metrics, final.verified, verdict, _quality(cfg))


def _log_model_states(a: _Run, trainer: Trainer, device: str) -> None:
    """The memory model checked on every run: the parameter and optimizer tensors each rank
    holds once training is done (the largest rank), against the model's bytes for them. Their
    sum is compared (where ZeRO-3 keeps its fp32 master partition, a parameter or an optimizer
    tensor, is bookkeeping); the gradients are not (DeepSpeed frees them after the step), nor an
    offloaded optimizer (on the host, where the model's device figure is 0)."""
    if a.cfg.parallelism.offload_optimizer != "none" or a.cfg.parallelism.offload_param != "none":
        return
    from pipeline.train.memstate import state_bytes

    held = state_bytes(trainer.engine)
    measured = _max_over_ranks({"states": float(held["params"] + held["optimizer"])})["states"]
    states = memory_estimate(a.cfg, on_gpu=device == "cuda").model_states
    m = {K.MEM_STATES_MEASURED_GIB: measured / GIB}
    if states.params_bytes + states.optimizer_bytes > 0:
        m[K.MEM_STATES_RATIO] = measured / (states.params_bytes + states.optimizer_bytes)
    a.log(m)


def _log_estimate(a: _Run, device: str) -> Any:
    """The memory model's prediction for the micro-batch the run uses (again after a search)."""
    est = memory_estimate(a.cfg, on_gpu=device == "cuda")
    a.tracker.set_tags({K.TAG_MEM_VERDICT: est.verdict})
    a.log(
        {
            K.MEM_ESTIMATE_GIB: est.total_bytes / GIB,
            K.MEM_ESTIMATE_MODEL_STATES_GIB: est.model_states.device_bytes / GIB,
            K.MEM_ESTIMATE_ACTIVATIONS_GIB: est.activations_bytes / GIB,
            # tensors only (no CUDA context, no allocator slack): the basis of the measured peak
            K.MEM_ESTIMATE_TENSORS_GIB: (
                est.model_states.device_bytes + est.activations_bytes + est.logits_bytes
            )
            / GIB,
            K.MEM_CAPACITY_GIB: est.capacity_bytes / GIB,
        }
    )
    return est


def _search_micro_batch(a: _Run, device: str) -> Outcome | None:
    """search.micro_batch: find the largest micro-batch that fits (pipeline/job/search.py) and
    run the rest of the point at it; a requeued attempt reuses the size its first attempt found.
    On CPU the job runs under the partition's device memory as a real limit from here on."""
    cfg = a.cfg
    capacity = search_capacity_bytes(cfg)
    vm_base = vm_bytes() if device == "cpu" else 0
    done = a.point.read_search()
    if done is None:
        start = cfg.search.start or largest_micro_batch(
            memory_query(cfg, on_gpu=device == "cuda"), cfg.search.headroom, cfg.search.cap
        )
        start = max(1, min(start, cfg.search.cap))

        def log(i: int, t: Trial) -> None:
            m = {
                K.SEARCH_TRIAL_MICRO_BATCH: t.micro_batch,
                K.SEARCH_TRIAL_FITS: float(t.fits),
                K.SEARCH_TRIAL_PEAK_GIB: t.peak_bytes / GIB,
            }
            if t.tokens_per_s is not None:
                m[K.SEARCH_TRIAL_TOKENS_PER_S] = t.tokens_per_s
            a.tracker.log_metrics(m, step=i)
            print(
                f"[job] search trial {i}: micro-batch {t.micro_batch}: {'fits' if t.fits else 'no'}"
                f"{' (out of memory: ' + t.error + ')' if t.error else ''}",
                flush=True,
            )

        res = search(cfg, device, capacity, start, log, vm_base)
        done = {**res.as_json(), "start": start}
        if a.renv.is_main:
            a.point.write_search(done)
    if device == "cpu":  # the run: the whole device memory above what the process maps now (no engine
        # is alive; what the trials left is allocator and thread-arena address space)
        limit_cpu_memory(vm_bytes() + capacity)
    ran = [t for t in done["trials"] if t["micro_batch"] == done["micro_batch"]]
    a.log(
        {
            K.SEARCH_MICRO_BATCH: done["micro_batch"],
            K.SEARCH_TRIALS: len(done["trials"]),
            K.SEARCH_WALL_S: done["wall_s"],
        }
    )
    if ran and ran[0]["tokens_per_s"] is not None:
        a.log({K.SEARCH_TOKENS_PER_S: ran[0]["tokens_per_s"]})
    if not done["micro_batch"]:
        return Outcome(
            K.OUTCOME_FAILED,
            K.REASON_OOM,
            f"no micro-batch fits: {len(done['trials'])} trial(s), "
            f"smallest tried {min(t['micro_batch'] for t in done['trials'])}",
        )
    cfg.parallelism.micro_batch = int(done["micro_batch"])
    _log_estimate(a, device)  # predicted at the size the run uses, beside what it measures
    return None


def _log_startup(a: _Run, res: TrainResult) -> None:
    """This attempt's start-up in parts, one point per attempt (step = its index)."""
    parts = {**a.startup, **res.startup}
    keys = {
        "import_s": K.STARTUP_IMPORT_S,
        "process_group_s": K.STARTUP_PROCESS_GROUP_S,
        "model_build_s": K.STARTUP_MODEL_BUILD_S,
        "engine_init_s": K.STARTUP_ENGINE_INIT_S,
        "ckpt_load_s": K.STARTUP_CKPT_LOAD_S,
    }
    a.log({key: parts[name] for name, key in keys.items() if name in parts}, step=len(a.prior))
    a.tracker.set_tags(node_tags(node_startup(parts, a.renv.hostname)))  # every rank: a collective


def _stop_record(
    a: _Run, trainer: Trainer, res: TrainResult, stop: StopFlag, phase: str = "train"
) -> StopRecord:
    """Why we stopped: a USR2 near the time limit (or under the timeout drill) is a time-out;
    any other USR2 a preemption; SIGTERM (scancel, scontrol requeue) means Slurm decides."""
    cfg = a.cfg
    limit_s = 60 * (
        cfg.drill.timeout.time_limit_min if cfg.drill.timeout.enabled else cfg.partition.time_limit_min
    )
    elapsed = (stop.signal_time or time.time()) - a.process_start
    if stop.signal_name == "SIGTERM":
        reason = "terminated"
    elif cfg.drill.timeout.enabled or elapsed >= 0.8 * limit_s:
        reason = "timeout"
    else:
        reason = "preempt"
    tags = trainer.checkpoints.tags()  # what was really committed, not what should have been
    return StopRecord(
        reason=reason,
        signal_time=stop.signal_time or time.time(),
        exit_time=0.0,
        stop_step=res.end_step,
        saved_step=step_of(tags[0]) if tags else 0,
        trigger=stop.signal_name,
        attempt=len(a.prior),
        phase=phase,
        drill_fired=bool(a.preempt and a.preempt.done),
    )


def _verify_drills(a: _Run, trainer: Trainer, res: TrainResult, device: str) -> DrillVerdict:
    """An interrupting drill passes only on evidence that it happened (pipeline.job.evidence:
    the stop, the save, the requeue, the resume from that checkpoint, on record), with every
    step's loss equal to an uninterrupted reference run with the same seed."""
    cfg = a.cfg
    drills = cfg.drill.interrupting()
    if not drills:
        return DrillVerdict(True)
    facts = [*(AttemptFacts.from_record(i, r) for i, r in enumerate(a.prior)), _current_facts(a, res)]
    kill = a.point.read_kill()
    missing = [
        m
        for d in drills
        for m in missing_evidence(
            d,
            facts,
            KillRecord(int(kill["rank"]), int(kill["after_step"])) if kill else None,
            cfg.drill.kill_worker.rank,
            float(cfg.train.pg_timeout_s),
        )
    ]
    if missing:
        return DrillVerdict(False, f"drill {'+'.join(drills)}: no evidence of " + "; ".join(missing))
    if sorted(res.losses) != list(range(1, cfg.train.steps + 1)):
        return DrillVerdict(
            False, f"steps after resume are not 1..{cfg.train.steps}: {sorted(res.losses)[:5]}..."
        )
    return _compare_with_reference(a, trainer, res, device)[0]


def _current_facts(a: _Run, res: TrainResult) -> AttemptFacts:
    """This attempt, as the evidence reads it (its record is written once it ends)."""
    return AttemptFacts.from_record(len(a.prior), {**resume_facts(res), **a.ctx.slurm_facts()})


def _compare_with_reference(
    a: _Run, trainer: Trainer, res: TrainResult, device: str
) -> tuple[DrillVerdict, float | None]:
    """Every step's loss against the uninterrupted reference run; and the largest difference."""
    cfg = a.cfg
    if not cfg.drill.reference:
        return DrillVerdict(True, "no reference run (drill.reference=false)"), None
    reference = _reference_losses(a, trainer, device)
    tol = cfg.drill.loss_tolerance
    diffs = {s: abs(reference[s] - res.losses.get(s, math.inf)) for s in sorted(reference)}
    worst = max(diffs.values())
    bad = [s for s, d in diffs.items() if d > tol]
    if bad:
        s = bad[0]
        return DrillVerdict(
            False,
            f"loss at step {s} after resume {res.losses.get(s)!r} != uninterrupted reference {reference[s]!r} "
            f"({len(bad)} step(s) differ, tolerance {tol})",
        ), worst
    return DrillVerdict(
        True, f"{len(reference)} losses equal the uninterrupted reference (tolerance {tol})"
    ), worst


def _finish_reshaped(a: _Run, trainer: Trainer, device: str) -> Outcome:
    """The reshape drill after the save at at_step: the job's rank 0 converts the checkpoint
    and runs the resumed ranks (pipeline.job.reshape), the others wait for the result; then every
    rank runs the reference and the losses are compared."""
    cfg, renv, res = a.cfg, a.renv, trainer.result
    saved_at = res.timeline.get("reshape_saved")  # None: an earlier attempt saved, and may have resumed
    a.ctx.progress.phase(DRILL, "reshape: a universal checkpoint, resumed on fewer ranks")
    trainer.engine = None  # free the job's engine (and its GPU memory) for the resumed ranks
    free_device_memory(device)
    if renv.is_main:
        result = reshape_on_main_rank(a.spec.config_yaml, cfg, a.point.path)
    else:
        result = wait_for_result(a.point.path)
    dist.barrier()
    if result.error:
        _log_results(a, trainer, res, device)
        return Outcome(
            K.OUTCOME_FAILED, K.REASON_DRILL_FAILED, f"reshape to {result.world_size} rank(s): {result.error}"
        )
    res.losses.update(result.losses)
    res.end_step = max(res.losses)
    tag = tag_for(res.end_step)
    res.roundtrips.append(
        RoundTrip(
            save=SaveStats(res.end_step, tag, result.ckpt_save_s, result.ckpt_bytes),
            load=LoadStats(res.end_step, tag, result.ckpt_load_s, result.ckpt_bytes, 0, {}),
            verified=result.verified,
        )
    )
    for step, loss in sorted(result.losses.items()):
        a.tracker.log_metrics({K.TRAIN_LOSS: loss}, step=step)
    a.log(
        {
            K.RESHAPE_WORLD_SIZE: result.world_size,
            K.RESHAPE_FROM_STEP: result.from_step,
            K.RESHAPE_CONVERT_S: result.convert_s,
            K.RESHAPE_START_TO_READY_S: result.start_to_ready_s,
            K.RESHAPE_LOAD_S: result.load_s,
            K.RESHAPE_FIRST_STEP_S: result.first_step_s,
            **({K.RESHAPE_TOTAL_S: result.first_step_done_at - saved_at} if saved_at else {}),
        }
    )
    try:
        verdict, worst = _compare_with_reference(a, trainer, res, device)
    except AttemptStopped:  # stopped while the reference run was under way: it resumes too
        _log_results(a, trainer, res, device)
        raise
    if worst is not None:
        a.log({K.RESHAPE_MAX_LOSS_DIFF: worst})
    if verdict.ok:
        verdict = DrillVerdict(
            True,
            f"resumed on {result.world_size} of {renv.world_size} rank(s) from step {result.from_step} through "
            f"a universal checkpoint; {verdict.detail}",
        )
    _log_results(a, trainer, res, device)
    return decide(res, trainer.cfg.steps, a.metrics, result.verified, verdict, _quality(cfg))


def _quality(cfg: Any) -> Quality:
    """The quality bar: the target eval loss on real data; the loss bound on the synthetic task."""
    return Quality.for_data(cfg.data.kind)


def _build_trainer(
    a: _Run,
    device: str,
    checkpoints: CheckpointManager,
    sink: Any = None,
    hooks: Any = (),
    client_state: Any = None,
    in_step_hooks: Any = (),
    progress: Any = None,
) -> Trainer:
    """A Trainer for this attempt's config and rank, stopping on the attempt's stop flag."""
    cfg, renv = a.cfg, a.renv
    return Trainer(
        cfg.model,
        cfg.precision,
        cfg.parallelism,
        cfg.train,
        renv.rank,
        renv.world_size,
        device,
        checkpoints,
        sink=sink,
        hooks=hooks,
        stop=a.stop,
        client_state=client_state,
        data=cfg.data,
        method=cfg.method,
        in_step_hooks=in_step_hooks,
        progress=progress,
    )


def _probe_data(a: _Run, trainer: Trainer) -> None:
    """The loader's read throughput from the run's storage, before training, on every rank at
    once (they share the storage); rank 0's figure is logged. Steps past train.steps are read,
    so the probe never warms the page cache for the windows the run trains on."""
    cfg, renv = a.cfg, a.renv
    tf = trainer.data.token_file
    a.tracker.set_tags({K.TAG_DATA: cfg.data.name + (f":{tf.path}" if tf else "")})
    if tf is not None:
        a.log({K.DATA_TRAIN_TOKENS: tf.n_train, K.DATA_EVAL_TOKENS: tf.n_eval})
    probe = trainer.data.probe(
        cfg.train.steps + 1, cfg.data.probe_batches, renv.rank, renv.world_size, cfg.parallelism.grad_accum
    )
    if probe is not None:
        a.log({K.DATA_READ_TOKENS_PER_S: probe.tokens_per_s})
        if probe.mb_per_s is not None:
            a.log({K.DATA_READ_MB_PER_S: probe.mb_per_s})


def _data_metrics(a: _Run, res: TrainResult, step_p50_s: float | None) -> dict[str, float]:
    """Data wait share, evaluations and the target (docs/data.md). Collective: every rank."""
    cfg = a.cfg
    timed = sorted(res.step_times)[cfg.train.warmup_steps :]
    step_s = sum(res.step_times[s] for s in timed)
    wait = {"frac": sum(res.data_wait.get(s, 0.0) for s in timed) / step_s if step_s > 0 else -1.0}
    m: dict[str, float] = {}
    frac = _max_over_ranks(wait)["frac"]
    if frac >= 0:
        m[K.DATA_WAIT_FRAC] = frac
    m[K.EVAL_TIME_S] = res.eval_s
    evals = res.eval_losses
    if evals:
        m[K.EVAL_FINAL_LOSS] = evals[max(evals)]
    first = evals.get(0)
    if first is not None:
        m[K.EVAL_FIRST_LOSS] = first
    target = None
    if first is not None or not cfg.accept.relative:
        target = cfg.accept.target(first if first is not None else math.nan)
    price = cfg.partition.price_usd_per_gpu_hour
    return {**m, **target_metrics(evals, target, step_p50_s, a.renv.world_size, price)}


def _reference_losses(a: _Run, trainer: Trainer, device: str) -> dict[int, float]:
    """The same run, uninterrupted, from the same seed: a second Trainer with no hooks and no
    sink. It checkpoints in its own folder and obeys the same stop flag, so a reference longer
    than what is left of the time limit is resumed by the next attempt like the run itself."""
    cfg, renv = a.cfg, a.renv
    t0 = time.perf_counter()
    a.ctx.progress.phase(DRILL, "reference run: starting")
    trainer.engine = None  # the run's engine is done with; free it before building another
    ref = _build_trainer(
        a,
        device,
        CheckpointManager(
            a.point.reference,
            cfg.train.checkpoint_interval,
            1,
            renv.rank,
            renv.world_size,
            DistComm(),
            io=cfg.train.checkpoint_io,
            commit_comm=DistComm(checkpoint_group()),
        ),
        progress=a.ctx.progress.within(DRILL, "reference run"),
    )
    ref.setup()
    out = ref.train()
    trainer.result.timeline["reference_s"] = time.perf_counter() - t0
    if out.stopped:
        raise AttemptStopped(_stop_record(a, ref, out, a.stop, phase="reference"), a.attempt_record())
    return out.losses


def _max_over_ranks(values: dict[str, float]) -> dict[str, float]:
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.tolist(), strict=True))


def _model_flops(cfg: Any) -> tuple[float, int, float | None]:
    """Model FLOPs per token of the method, the non-embedding parameters, and the hardware FLOPs
    per token (None where not modelled). Adapters, and a described model (any family: a
    model.pretrained folder, a preset of another model type), from the model's description built
    here on the meta device; a full fine-tune of an analytic llama/gpt2 preset from its shape,
    with the recompute of activation checkpointing in the hardware FLOPs (elsewhere, with
    checkpointing, hardware FLOPs are absent)."""
    method, ckpt = cfg.method, cfg.parallelism.activation_checkpointing
    if described(cfg.model) or method.adapters:
        from pipeline.measure import describe as desc
        from pipeline.train.describe import describe_model

        d = desc.ModelDescription.from_json(describe_model(cfg.model, list(method.target_modules) or None))
        flops = desc.training_flops_per_token(
            d, cfg.model.seq_len, method.name, method.lora_rank, method.target_modules
        )
        return flops, desc.non_embedding_params(d), None if ckpt else flops
    shape = ModelShape.of(cfg.model)
    return model_flops_per_token(shape), non_embedding_params(shape), hardware_flops_per_token(shape, ckpt)


def _log_results(a: _Run, trainer: Trainer, res: TrainResult, device: str) -> None:
    cfg, renv = a.cfg, a.renv
    a.ctx.progress.phase(FINISHING, "the results")
    world = renv.world_size
    flops_per_token, non_embedding, hw_per_token = _model_flops(cfg)
    m: dict[str, float] = {
        K.TRAIN_STEPS: res.end_step,
        K.TRAIN_TOKENS: res.end_step * trainer.tokens_per_step,
        K.TRAIN_LOSS_BOUND: cfg.train.loss_bound_frac * math.log(cfg.model.vocab_size),
    }
    if 1 in res.losses:  # the measured loss of the first step (absent when this attempt lacks it)
        m[K.TRAIN_INITIAL_LOSS] = res.losses[1]
    if trainer.params is not None:  # counted on the built model
        m[K.TRAIN_PARAMS] = trainer.params.total
        m[K.TRAIN_TRAINABLE_PARAMS] = trainer.params.trainable
        m[K.TRAIN_TRAINABLE_FRAC] = trainer.params.trainable_frac
    if flops_per_token is not None:
        m[K.TRAIN_NON_EMBEDDING_PARAMS] = non_embedding
        m[K.PERF_MODEL_FLOPS_PER_TOKEN] = flops_per_token
    if res.losses:
        last = [res.losses[s] for s in sorted(res.losses)[-3:]]
        m[K.TRAIN_FINAL_LOSS] = statistics.fmean(last)
    times = [res.step_times[s] for s in sorted(res.step_times)]
    stats = step_stats(times, cfg.train.warmup_steps)
    m.update(_data_metrics(a, res, stats.p50_s if stats is not None else None))
    if stats is not None:
        tokens_per_s = trainer.tokens_per_step / stats.p50_s
        m[K.PERF_TOKENS_PER_S] = tokens_per_s
        m.update(
            {
                K.PERF_STEP_P50_S: stats.p50_s,
                K.PERF_STEP_P95_S: stats.p95_s,
                K.PERF_WARMUP_STEPS: stats.excluded_steps,
                K.PERF_TIMED_STEPS: stats.timed_steps,
                **({K.PERF_STEP_CV: stats.cv} if stats.cv is not None else {}),
            }
        )
    if stats is not None and flops_per_token is not None:
        achieved = tokens_per_s * flops_per_token / world  # model FLOP/s per device
        hardware = tokens_per_s * hw_per_token / world if hw_per_token is not None else None
        m[K.PERF_ACHIEVED_TFLOPS] = achieved / 1e12
        # the datasheet peak applies only to the GPU the partition names (and never to a CPU)
        on_partition_gpu = device == "cuda" and not getattr(a, "gpu_mismatch", None)
        peak_tflops = cfg.partition.peak_tflops.get(cfg.precision.name) if on_partition_gpu else None
        peak = peak_tflops * 1e12 if peak_tflops else None
        for key, value in (
            (K.PERF_MFU, mfu(achieved, peak)),
            (K.PERF_HFU, mfu(hardware, peak) if hardware else None),
        ):
            if value is not None:
                m[key] = value
        ceiling = a.metrics.get(K.PERF_CEILING_TFLOPS)
        if ceiling:  # the largest fraction of the probe's rate, not capped (it may pass 1)
            m[K.PERF_MFU_VS_CEILING] = achieved / (ceiling * 1e12)

    m.update(a.observer.finish(res))  # collectives: every rank
    mem = _max_over_ranks(peak_memory_gib(device))
    m[K.MEM_PEAK_RSS_GIB] = mem["rss"]
    used = mem.get("allocated", mem["rss"])
    a.tracker.set_tags({K.TAG_MEM_SOURCE: "cuda_max_allocated" if "allocated" in mem else "rss"})
    if "allocated" in mem:
        m[K.MEM_PEAK_ALLOCATED_GIB], m[K.MEM_PEAK_RESERVED_GIB] = mem["allocated"], mem["reserved"]
    capacity = a.metrics[K.MEM_CAPACITY_GIB]
    if capacity > 0:
        # one basis for both: 1 - peak bytes of tensors / capacity. Measured: max_memory_allocated
        # on GPU (RSS on CPU, tag mem_source); predicted: the model's tensors (model states,
        # activations, logits), without its CUDA context and fragmentation allowance
        m[K.MEM_HEADROOM_FRAC] = 1.0 - used / capacity
        m[K.MEM_ESTIMATE_HEADROOM_FRAC] = 1.0 - a.metrics[K.MEM_ESTIMATE_TENSORS_GIB] / capacity

    trips = res.roundtrips
    if trips:
        last_trip = trips[-1]
        m.update(
            {
                K.CKPT_SAVE_S: last_trip.save.seconds,
                K.CKPT_STALL_S: last_trip.save.stalled_s,
                K.CKPT_LOAD_S: last_trip.load.seconds,
                K.CKPT_BYTES: last_trip.save.bytes,
                K.CKPT_VERIFIED: float(last_trip.verified),
            }
        )
        # a rate over a time that rounds to 0 is not defined: absent, never 0 GB/s
        for key, io in ((K.CKPT_SAVE_GBPS, last_trip.save), (K.CKPT_LOAD_GBPS, last_trip.load)):
            if io.seconds > 0 and io.bytes > 0:
                m[key] = io.bytes / 1e9 / io.seconds
    saves = trainer.checkpoints.saves
    prior = a.prior
    m[K.CKPT_SAVES] = len(saves) + sum(p.get("saves", 0) for p in prior)
    m[K.CKPT_VERIFIED_COUNT] = sum(t.verified for t in trips) + sum(p.get("verified", 0) for p in prior)
    m[K.CKPT_FALLBACKS] = res.load.fallbacks if res.load else 0
    if "first_step_done" in res.timeline:  # this attempt's start, cold or after a stop
        a.log({K.RESTART_COLD_START_S: res.timeline["first_step_done"] - a.process_start}, step=len(prior))
    restart = None
    if a.prev_stop is not None and "first_step_done" in res.timeline:
        restart = breakdown(a.prev_stop, a.process_start, res.timeline, res.start_step)
        parts = {
            K.RESTART_SIGNAL_TO_EXIT_S: restart.signal_to_exit_s,
            K.RESTART_EXIT_TO_START_S: restart.exit_to_start_s,
            K.RESTART_START_TO_READY_S: restart.start_to_ready_s,
            K.RESTART_LOAD_S: restart.load_s,
            K.RESTART_FIRST_STEP_S: restart.first_step_s,
            K.RESTART_TOTAL_S: restart.total_s,
            K.RESTART_LOST_STEPS: restart.lost_steps,
        }
        a.log(parts, step=len(prior))  # one point per restart, at the attempt's index
        a.tracker.set_tags({K.TAG_RESTART_REASON: restart.reason})
    this = a.observer.with_record(attempt_record(a.process_start, world, trainer))
    if restart is not None and res.step_times:
        # the steps the previous attempt did after its last checkpoint were done again here
        this["lost_s"] = restart.lost_steps * statistics.median(res.step_times.values())
    a.record = this
    m.update(a.observer.energy_metrics([*prior, this]))
    a.log(m)  # the run's time and cost over its attempts: pipeline.job.entry, as the point ends
