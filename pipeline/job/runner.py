"""One attempt on one rank, as named stages (docs/design.md, "The attempt"):

- `prepare`: DeepSpeed's import, the device, the memory model's verdict, the GPU check, the
  precision check, the process group, the micro-batch search;
- `probe`: the matmul ceiling, collective bandwidth, the node health gate;
- `build`: the drills' step hooks, the trainer, the data read probe;
- `train`: set-up (resume), the fine-tune, a drill's hand-over (reshape's resumed ranks);
- `verify`: the final checkpoint's round trip, the drills' evidence, the reference run;
- `record`: the ranks' agreement, then the derived numbers (pure: pipeline.job.derived) and
  the attempt's record.

`Attempt.run` is the only path through them: an early ending of `prepare` or `probe` (before
any trainer) returns at once; once a trainer is built, every ending (an outcome, a stop of the
run or of its reference) goes through `record` exactly once.

Collectives (every rank calls them at the same point, whatever its own figures): the health
gate (`probe`), the nodes' start-up rows (`train`), the preempt drill's trigger verdict (inside
the trainer's step), the reshape barrier (its hand-over, `train`), and the record stage's `agree` (telemetry
gathered, one max over ranks); none sits behind a branch a single rank can take."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from pipeline.config.pretrained import described
from pipeline.config.validate import memory_estimate, memory_query, search_capacity_bytes
from pipeline.contract.accounting import attempt_record
from pipeline.contract.gpu import check_partition, inventory
from pipeline.contract.outcome import Outcome, Reason
from pipeline.contract.records import AttemptRecord, Phase, StopRecord
from pipeline.contract.spec import PointEnd
from pipeline.data.chatset import chat_cache_path, length_stats
from pipeline.drills import time_limit
from pipeline.files import write_atomic
from pipeline.job import derived, drills, nodeprobes
from pipeline.job.attempt import AttemptContext, AttemptEnd, AttemptStopped
from pipeline.job.commprobe import probe_collectives
from pipeline.job.drills import HandedOver, HandOver, Verified, is_peer_failure, peer_failure, reference
from pipeline.job.drills.base import RunStopped as _Stopped
from pipeline.job.observe import Observer
from pipeline.job.recorder import present
from pipeline.job.results import Quality, classify, decide, target_metrics
from pipeline.job.search import Trial, limit_cpu_memory, search, vm_bytes
from pipeline.job.startup import import_deepspeed, node_startup, node_tags
from pipeline.measure.flops import (
    ModelShape,
    hardware_flops_per_token,
    model_flops_per_token,
    non_embedding_params,
)
from pipeline.measure.memory import Verdict, largest_micro_batch
from pipeline.measure.stats import step_stats
from pipeline.measure.timeline import Mark
from pipeline.sched.warm import warm_import_s
from pipeline.tracking import keys as K
from pipeline.train.checkpoint import CheckpointManager, step_of
from pipeline.train.data import ChatBatches
from pipeline.train.probes import (
    measure_matmul_tflops,
    peak_memory_gib,
    reset_peak_memory,
)
from pipeline.train.progress import FINISHING, STARTING
from pipeline.train.trainer import (
    DTYPES,
    Trainer,
    TrainResult,
    check_precision,
    run_dir_checkpoints,
)

log = logging.getLogger(__name__)

GIB = 2**30


def execute(ctx: AttemptContext) -> AttemptEnd:
    """Run the attempt to its outcome; raise AttemptStopped when it must be requeued. Any other
    exception is the point's failure (the entry classifies it)."""
    attempt = Attempt(ctx)
    try:
        ending = attempt.run()
    except Exception as e:
        if attempt.trainer is not None and classify(e)[1] == Reason.CRASH and is_peer_failure(e):
            raise AttemptStopped(peer_failure(attempt, e), attempt.attempt_record()) from e
        raise
    if isinstance(ending, StopRecord):
        raise AttemptStopped(ending, attempt.attempt_record())
    return AttemptEnd(ending, attempt.attempt_record())


@dataclass(frozen=True)
class Agreed:
    """The ranks' agreement of the record stage: the observer's gathered metrics and the
    largest rank's figures."""

    observed: dict[str, float]
    peak_gib: dict[str, float]
    wait_frac: float | None
    states_bytes: float | None


class Attempt:
    """One attempt of a run on one rank: its context, what it builds, and its stages."""

    def __init__(self, ctx: AttemptContext) -> None:
        self.ctx = ctx
        self.cfg, self.renv, self.point = ctx.cfg, ctx.renv, ctx.point
        self.prior = list(ctx.prior)
        self.recorder = ctx.recorder  # the one door metrics and tags leave by
        self.metrics = ctx.recorder.values
        self.device = "cpu"
        self.trainer: Trainer | None = None  # set once built, so a failure can still say what it knows
        self.gpu_mismatch: str | None = None  # the GPU is not the partition's type
        self.record: AttemptRecord | None = None  # this attempt's record, once its results are in
        self.observer = Observer(ctx)  # node health gate, telemetry, stragglers
        self.startup: dict[str, float] = {}  # import_s, process_group_s (then the trainer's parts)
        self.hooks: list[Any] = []  # the drills' step hooks
        self.held_states: float | None = None  # parameter + optimizer bytes this rank holds, after training

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.recorder.log(metrics, step)

    def attempt_record(self) -> AttemptRecord:
        return self.record or attempt_record(self.ctx.process_start, self.renv.world_size, self.trainer)

    def run(self) -> PointEnd | StopRecord:
        """The stages in order; the outcome, or the stop that ends this attempt for a requeue."""
        early = self.prepare() or self.probe()
        if early is not None:  # no trainer: the record is the attempt's times (and the gate's nodes)
            self.record = self.observer.with_record(
                attempt_record(self.ctx.process_start, self.renv.world_size)
            )
            return early
        trainer = self.trainer = self.build()
        ending: Verified | PointEnd | StopRecord
        try:
            ending = self.verify(trainer, self.train(trainer))
        except _Stopped as stopped:  # the run, or its reference run, stopped and saved
            ending = stopped.record
        self.record_results(trainer)
        if isinstance(ending, Verified):
            end = decide(
                trainer.result,
                trainer.cfg.steps,
                self.metrics,
                ending.final_verified,
                ending.drills,
                _quality(self.cfg),
            )
            end.notes += [trainer.result.resume_note] if trainer.result.resume_note else []
            return end
        return ending

    # -- prepare ----------------------------------------------------------------------------

    def prepare(self) -> PointEnd | None:
        """Up to the process group: an outcome when the run cannot start (it does not fit, no
        micro-batch fits); an unsupported precision raises on every rank alike."""
        from pipeline.job.distributed import device_for, init_process_group

        cfg, renv = self.cfg, self.renv
        import_deepspeed(logs=renv.is_main and cfg.tracking.enabled)  # here: its import is timed as such
        self.startup["import_s"] = time.time() - self.ctx.process_start
        if (paid := warm_import_s()) is not None:
            self.startup["warm_import_s"] = paid  # what the warm server's imports took, once
        torch.set_num_threads(max(1, cfg.partition.cpus_per_task))
        self.device = device_for(renv.local_rank)
        est = self._log_estimate()
        if est.verdict == Verdict.DOES_NOT_FIT and cfg.train.skip_if_no_fit and self.device == "cuda":
            return PointEnd(
                Outcome.FAILED,
                Reason.DOES_NOT_FIT,
                f"estimated {est.total_bytes / GIB:.1f} GiB per device of {est.capacity_bytes / GIB:.1f} GiB "
                f"(headroom {est.headroom_frac:.0%}, below 15%)",
            )
        self._check_gpu()
        check_precision(cfg.precision)  # fp16 on a CPU ends here, cleanly, on every rank
        self.ctx.progress.phase(
            STARTING,
            "the process group (DeepSpeed's comm op is compiled here if it was not built at install)",
        )
        t0 = time.perf_counter()
        init_process_group(self.device, cfg.train.pg_timeout_s)
        self.startup["process_group_s"] = time.perf_counter() - t0
        self._log_stack()
        if cfg.search.micro_batch:
            self.ctx.progress.phase(STARTING, "the micro-batch search")
            return self._search_micro_batch()
        return None

    def _log_stack(self) -> None:
        """The software stack (rank 0's) and the container with every rank's namespaces (one
        all-gather): pipeline.job.stack."""
        from pipeline.job import stack

        ranks: list[Any] = [stack.namespaces()]
        if self.renv.world_size > 1:
            mine, ranks = ranks[0], [None] * self.renv.world_size
            dist.all_gather_object(ranks, mine)
        label = os.environ.get(stack.CONTAINER_ENV) or "none"
        self.recorder.tags({**stack.stack_tags(), **stack.container_tags(label, ranks)})

    def _check_gpu(self) -> None:
        """Tag the device and driver; say when the GPU is not the partition's, or there is none."""
        cfg, renv, device = self.cfg, self.renv, self.device
        gpus, note = inventory()
        self.gpu_mismatch = (
            check_partition(gpus, cfg.partition.gpu_type, renv.local_rank) if device == "cuda" else None
        )
        gpu = gpus[renv.local_rank % len(gpus)] if gpus and device == "cuda" else None
        self.recorder.tags(
            {
                K.TAG_DEVICE: f"cuda:{gpu.name}" if gpu else "cpu",
                K.TAG_GPU_DRIVER: f"{gpu.driver} (CUDA {gpu.cuda_driver})" if gpu else note,
                **({K.TAG_GPU_MISMATCH: self.gpu_mismatch} if self.gpu_mismatch else {}),
            }
        )
        if self.gpu_mismatch:
            log.warning("%s; no MFU against the partition's datasheet peak", self.gpu_mismatch)
        if device == "cpu" and cfg.partition.is_gpu:
            log.warning(
                "no GPU visible on %s: partition '%s' promises %s GPUs, so this run trains on the CPU over gloo. "
                "CUDA memory, NCCL bandwidth and MFU against the datasheet peak are not measured; MFU is against "
                "a measured ceiling.",
                renv.hostname,
                cfg.partition.name,
                cfg.partition.gpu_type,
            )

    def _log_estimate(self) -> Any:
        """The memory model's prediction for the micro-batch the run uses (again after a search)."""
        est = memory_estimate(self.cfg, on_gpu=self.device == "cuda")
        self.recorder.tags({K.TAG_MEM_VERDICT: est.verdict})
        tensors = est.model_states.device_bytes + est.activations_bytes + est.logits_bytes
        self.log(
            {
                K.MEM_ESTIMATE_GIB: est.total_bytes / GIB,
                K.MEM_ESTIMATE_MODEL_STATES_GIB: est.model_states.device_bytes / GIB,
                K.MEM_ESTIMATE_ACTIVATIONS_GIB: est.activations_bytes / GIB,
                # tensors only (no CUDA context, no allocator slack): the basis of the measured peak
                K.MEM_ESTIMATE_TENSORS_GIB: tensors / GIB,
                K.MEM_CAPACITY_GIB: est.capacity_bytes / GIB,
            }
        )
        return est

    def _search_micro_batch(self) -> PointEnd | None:
        """search.micro_batch: find the largest micro-batch that fits (pipeline/job/search.py) and
        run the rest of the point at it; a requeued attempt reuses the size its first attempt found.
        On CPU the job runs under the partition's device memory as a real limit from here on."""
        cfg, device = self.cfg, self.device
        capacity = search_capacity_bytes(cfg)
        vm_base = vm_bytes() if device == "cpu" else 0
        done = self.point.read_search()
        if done is None:
            start = cfg.search.start or largest_micro_batch(
                memory_query(cfg, on_gpu=device == "cuda"), cfg.search.headroom, cfg.search.cap
            )
            start = max(1, min(start, cfg.search.cap))
            res = search(cfg, device, capacity, start, self._log_trial, vm_base)
            done = {**res.as_json(), "start": start}
            if self.renv.is_main:
                self.point.write_search(done)
        if device == "cpu":  # the run: the whole device memory above what the process maps now (no engine
            # is alive; what the trials left is allocator and thread-arena address space)
            limit_cpu_memory(vm_bytes() + capacity)
        ran = [t for t in done["trials"] if t["micro_batch"] == done["micro_batch"]]
        self.log(
            {
                K.SEARCH_MICRO_BATCH: done["micro_batch"],
                K.SEARCH_TRIALS: len(done["trials"]),
                K.SEARCH_WALL_S: done["wall_s"],
            }
        )
        if ran and ran[0]["tokens_per_s"] is not None:
            self.log({K.SEARCH_TOKENS_PER_S: ran[0]["tokens_per_s"]})
        if not done["micro_batch"]:
            return PointEnd(
                Outcome.FAILED,
                Reason.OOM,
                f"no micro-batch fits: {len(done['trials'])} trial(s), "
                f"smallest tried {min(t['micro_batch'] for t in done['trials'])}",
            )
        cfg.parallelism.micro_batch = int(done["micro_batch"])
        self._log_estimate()  # predicted at the size the run uses, beside what it measures
        return None

    def _log_trial(self, i: int, t: Trial) -> None:
        m = {
            K.SEARCH_TRIAL_MICRO_BATCH: t.micro_batch,
            K.SEARCH_TRIAL_FITS: float(t.fits),
            K.SEARCH_TRIAL_PEAK_GIB: t.peak_bytes / GIB,
        }
        if t.tokens_per_s is not None:
            m[K.SEARCH_TRIAL_TOKENS_PER_S] = t.tokens_per_s
        self.recorder.series(m, step=i)
        log.info(
            "search trial %d: micro-batch %s: %s%s",
            i,
            t.micro_batch,
            "fits" if t.fits else "no",
            f" (out of memory: {t.error})" if t.error else "",
        )

    # -- probe ------------------------------------------------------------------------------

    def probe(self) -> PointEnd | None:
        """The matmul ceiling and collective bandwidth (as configured), then the node health
        gate (a collective): an outcome when a node failed it."""
        cfg, device, renv = self.cfg, self.device, self.renv
        self.ctx.progress.phase(STARTING, "probes: matmul ceiling, collectives, node health")
        # the nodes as the scheduler names them (fake nodes of one host share its hostname)
        nodes = [self.ctx.slurm.nodelist] if self.ctx.slurm and self.ctx.slurm.nodelist else renv.nodes
        here = nodeprobes.here_now(
            nodes, renv.world_size, device, cfg.precision.name, cfg.train, len(self.prior)
        )
        earlier = nodeprobes.decide(self.point, here, self.ctx.prev_stop, cfg.train.reuse_probes_s, renv.rank)
        if earlier is not None:  # a restart in the same place (pipeline/job/nodeprobes.py)
            self.log(earlier.metrics)
            self.recorder.tags({K.TAG_PROBES: nodeprobes.reused_line(earlier, here.time)})
        else:
            measured: dict[str, float] = {}
            if cfg.train.measure_ceiling:
                measured[K.PERF_CEILING_TFLOPS] = measure_matmul_tflops(device, DTYPES[cfg.precision.name])
            if cfg.train.measure_comm and renv.world_size > 1:
                measured.update(probe_collectives(cfg, device))
            self.log(measured)
            self.recorder.tags({K.TAG_PROBES: nodeprobes.MEASURED})
            if renv.is_main:
                self.point.write_probes(replace(here, metrics=present(measured)).as_json())
        return self.observer.gate(
            device, self.metrics.get(K.PERF_CEILING_TFLOPS), self.metrics.get(K.COMM_ALLREDUCE_BUSBW)
        )

    # -- build ------------------------------------------------------------------------------

    def build(self) -> Trainer:
        """The drills' step hooks, telemetry, the trainer and the data read probe; rank 0 keeps
        the DeepSpeed config beside the run."""
        cfg, renv = self.cfg, self.renv
        self.hooks = drills.build_hooks(self.ctx)
        self.observer.start_telemetry()
        if drills.needs_reference(cfg.drill):  # a reference run follows
            self.ctx.progress.expect(drill_steps=cfg.train.steps)
        trainer = self._trainer(
            run_dir_checkpoints(self.point.path, cfg.train, renv.rank, renv.world_size),
            sink=self.recorder,
            hooks=[*self.hooks, *self.observer.step_hooks(self.device)],
            client_state={"mlflow_run_id": self.recorder.run_id},
            in_step_hooks=self.observer.in_step_hooks(),
            progress=self.ctx.progress,
        )
        self._probe_data(trainer)
        if renv.is_main:
            ds_path = self.point.ds_config
            write_atomic(ds_path, json.dumps(trainer.ds_config, indent=1))
            self.recorder.artifact(ds_path)
        return trainer

    def _trainer(self, checkpoints: CheckpointManager, **parts: Any) -> Trainer:
        """A Trainer for this attempt's config and rank, stopping on the attempt's stop flag."""
        cfg, renv = self.cfg, self.renv
        return Trainer(
            cfg.model,
            cfg.precision,
            cfg.parallelism,
            cfg.train,
            renv.rank,
            renv.world_size,
            self.device,
            checkpoints,
            stop=self.ctx.stop,
            data=cfg.data,
            method=cfg.method,
            **parts,
        )

    def _probe_data(self, trainer: Trainer) -> None:
        """The loader's read throughput from the run's storage, before training, on every rank at
        once (they share the storage); rank 0's figure is logged. Steps past train.steps are read,
        so the probe never warms the page cache for the windows the run trains on."""
        cfg, renv = self.cfg, self.renv
        tf = trainer.data.token_file
        where = tf.path if tf else cfg.data.path if cfg.data.kind == "chat" else None
        self.recorder.tags({K.TAG_DATA: cfg.data.name + (f":{where}" if where else "")})
        if renv.is_main:  # the one rank that records it reads the file (1 MiB) for it
            # where the file lies is no part of the workload: sweeps of two clusters compare on this
            fingerprint = (
                tf.fingerprint()
                if tf
                else f"chat:{chat_cache_path(cfg.data)[0].stem}"
                if cfg.data.kind == "chat"
                else f"synthetic:alphabet={cfg.data.alphabet}"
            )
            self.recorder.tags({K.TAG_DATA_FINGERPRINT: fingerprint})
        if tf is not None:
            self.log({K.DATA_TRAIN_TOKENS: tf.n_train, K.DATA_EVAL_TOKENS: tf.n_eval})
        if trainer.data.chat is not None and renv.is_main:
            self.log(chat_counts(trainer.data.chat))
            self.recorder.params(
                {f"{K.PARAM_DATA_LENGTHS}{k}": v for k, v in length_stats(trainer.data.chat.data).items()}
            )
        probe = trainer.data.probe(
            cfg.train.steps + 1,
            cfg.data.probe_batches,
            renv.rank,
            renv.world_size,
            cfg.parallelism.grad_accum,
        )
        if probe is not None:
            self.log({K.DATA_READ_TOKENS_PER_S: probe.tokens_per_s})
            if probe.mb_per_s is not None:
                self.log({K.DATA_READ_MB_PER_S: probe.mb_per_s})

    # -- train ------------------------------------------------------------------------------

    def train(self, trainer: Trainer) -> HandedOver | None:
        """Set-up (the engine, the resume), then the fine-tune; raises _Stopped when a stop
        request saved it. A drill that takes the run over at its step (its hook raises
        HandOver: reshape) runs the rest: what it returned is returned."""
        cfg = self.cfg
        reset_peak_memory(self.device)
        res = trainer.setup()
        self._log_startup(res)
        if res.resume_note:  # said in the job log (the manager's line), the run's tags, the outcome
            self.recorder.tags({K.TAG_RESUME_NOTE: res.resume_note})
        taker = drills.handing_over(cfg.drill, res.start_step)
        if taker is not None:
            return taker.hand_over(self, trainer)  # an earlier attempt got there
        try:
            res = trainer.train()
        except HandOver as h:
            return drills.BY_NAME[h.drill].hand_over(self, trainer)
        if res.stopped:
            raise _Stopped(self._stop_record(trainer, res))
        if cfg.parallelism.offload_optimizer == "none" and cfg.parallelism.offload_param == "none":
            from pipeline.train.memstate import state_bytes

            held = state_bytes(trainer.engine)  # before the verify stage frees the engine
            self.held_states = float(held["params"] + held["optimizer"])
        return None

    def _log_startup(self, res: TrainResult) -> None:
        """This attempt's start-up in parts, one point per attempt (step = its index); then every
        node's parts as tags (a collective: every rank, right after set-up)."""
        parts = {**self.startup, **res.startup}
        keys = {
            "import_s": K.STARTUP_IMPORT_S,
            "process_group_s": K.STARTUP_PROCESS_GROUP_S,
            "model_build_s": K.STARTUP_MODEL_BUILD_S,
            "engine_init_s": K.STARTUP_ENGINE_INIT_S,
            "ckpt_load_s": K.STARTUP_CKPT_LOAD_S,
            "warm_import_s": K.STARTUP_WARM_IMPORT_S,
        }
        self.log({key: parts[name] for name, key in keys.items() if name in parts}, step=len(self.prior))
        self.recorder.tags(node_tags(node_startup(parts, self.renv.hostname)))

    def _stop_record(self, trainer: Trainer, res: TrainResult, phase: Phase = Phase.TRAIN) -> StopRecord:
        """Why `trainer` (the run, or its reference) stopped, and what it had committed; the
        signal is the one the ranks agree on (every rank stops here together, after its save)."""
        cfg, stop = self.cfg, self.ctx.stop
        drill_limit = time_limit(cfg.drill)  # the time-out drill's limit, shorter than the partition's
        limit_s = 60 * (drill_limit[0] if drill_limit else cfg.partition.time_limit_min)
        name, when = derived.agreed_signal(trainer.comm.gather_obj((stop.signal_name, stop.signal_time)))
        signal_time = when or time.time()
        tags = trainer.checkpoints.tags()  # what was really committed, not what should have been
        return StopRecord(
            reason=derived.stop_reason(
                name, drill_limit is not None, signal_time - self.ctx.process_start, limit_s
            ),
            signal_time=signal_time,
            exit_time=0.0,
            stop_step=res.end_step,
            saved_step=step_of(tags[0]) if tags else 0,
            trigger=name,
            attempt=len(self.prior),
            phase=phase,
            drill_fired=any(getattr(h, "fired", False) for h in self.hooks),
        )

    # -- verify -----------------------------------------------------------------------------

    def verify(self, trainer: Trainer, handed: HandedOver | None) -> Verified | PointEnd:
        """The final checkpoint's round trip and the drills' verdict (evidence, then every step's
        loss against the reference run); a run a drill took over, checked by that drill."""
        if handed is not None:
            return handed.verify(self, trainer)
        res = trainer.result
        final = trainer.roundtrip(res.end_step)
        return Verified(final.verified, reference.verify_evidence(self, trainer, res))

    # -- record -----------------------------------------------------------------------------

    def agree(self, res: TrainResult) -> Agreed:
        """Every collective of the record stage, in one place, on every rank: the observer's
        gather (telemetry, forward times), then one max over ranks of the peak memory, the data
        wait share and the model states held."""
        observed = self.observer.finish(res)
        wait = derived.data_wait_frac(res.step_times, res.data_wait, self.cfg.train.warmup_steps)
        mine = {f"peak.{k}": v for k, v in peak_memory_gib(self.device).items()}
        mine["wait"] = -1.0 if wait is None else wait
        if self.held_states is not None:  # the same on every rank: taken on the same path
            mine["states"] = self.held_states
        top = _max_over_ranks(mine)
        return Agreed(
            observed=observed,
            peak_gib={k.removeprefix("peak."): v for k, v in top.items() if k.startswith("peak.")},
            wait_frac=top["wait"] if top["wait"] >= 0 else None,
            states_bytes=top.get("states"),
        )

    def record_results(self, trainer: Trainer) -> None:
        """The record stage: the ranks agree, then every derived number is logged and this
        attempt's record kept (the entry writes it). The run's time and cost over its attempts:
        pipeline.job.entry, as the point ends."""
        self.ctx.progress.phase(FINISHING, "the results")
        res = trainer.result
        agreed = self.agree(res)
        m = self._train_metrics(trainer, res)
        stats = step_stats([res.step_times[s] for s in sorted(res.step_times)], self.cfg.train.warmup_steps)
        m.update(self._data_metrics(res, agreed.wait_frac, stats.p50_s if stats is not None else None))
        m.update(derived.step_metrics(stats, trainer.tokens_per_step))
        m.update(chat_rates(trainer, stats.p50_s if stats is not None else None))
        m.update(self._flops_metrics(m.get(K.PERF_TOKENS_PER_S), m.get(K.DATA_REAL_TOKENS_PER_S)))
        m.update(agreed.observed)
        m.update(self._memory_metrics(agreed))
        if res.roundtrips:
            m.update(derived.checkpoint_metrics(res.roundtrips[-1]))
        m.update(
            derived.checkpoint_counts(
                len(trainer.checkpoints.saves),
                sum(t.verified for t in res.roundtrips),
                res.skipped_checkpoints,
                self.prior,
            )
        )
        this = self.observer.with_record(
            attempt_record(self.ctx.process_start, self.renv.world_size, trainer)
        )
        lost_s = self._log_restart(res)
        if (
            lost_s is not None
        ):  # the steps the previous attempt did after its last checkpoint, done again here
            this.lost_s = lost_s
        self.record = this
        m.update(self.observer.energy_metrics([*self.prior, this]))
        self.log(m)

    def _train_metrics(self, trainer: Trainer, res: TrainResult) -> dict[str, float]:
        cfg = self.cfg
        m = derived.train_metrics(
            res.end_step, trainer.tokens_per_step, res.losses, cfg.model.vocab_size, cfg.train.loss_bound_frac
        )
        if trainer.params is not None:  # counted on the built model
            m[K.TRAIN_PARAMS] = trainer.params.total
            m[K.TRAIN_TRAINABLE_PARAMS] = trainer.params.trainable
            m[K.TRAIN_TRAINABLE_FRAC] = trainer.params.trainable_frac
        return m

    def _flops_metrics(
        self, tokens_per_s: float | None, useful_per_s: float | None = None
    ) -> dict[str, float]:
        """Model FLOPs per token and what the throughput makes of them (absent with no timed step)."""
        cfg = self.cfg
        flops_per_token, non_embedding, hw_per_token = _model_flops(cfg)
        m = {
            K.TRAIN_NON_EMBEDDING_PARAMS: float(non_embedding),
            K.PERF_MODEL_FLOPS_PER_TOKEN: flops_per_token,
        }
        if tokens_per_s is None:
            return m
        peak = derived.datasheet_peak_flops(
            self.device, self.gpu_mismatch, cfg.partition.peak_tflops, cfg.precision.name
        )
        ceiling = self.metrics.get(K.PERF_CEILING_TFLOPS)
        return {
            **m,
            **derived.flops_metrics(
                tokens_per_s, flops_per_token, hw_per_token, self.renv.world_size, peak, ceiling, useful_per_s
            ),
        }

    def _data_metrics(
        self, res: TrainResult, wait_frac: float | None, step_p50_s: float | None
    ) -> dict[str, float]:
        """Data wait share (the largest rank's), evaluations and the target (docs/data.md)."""
        cfg = self.cfg
        m = {K.DATA_WAIT_FRAC: wait_frac} if wait_frac is not None else {}
        m.update(derived.eval_metrics(res.eval_losses, res.eval_s))
        first = res.eval_losses.get(0)
        target = None
        if first is not None or not cfg.accept.relative:
            target = cfg.accept.target(first if first is not None else math.nan)
        price = cfg.partition.price_usd_per_gpu_hour
        return {**m, **target_metrics(res.eval_losses, target, step_p50_s, self.renv.world_size, price)}

    def _memory_metrics(self, agreed: Agreed) -> dict[str, float]:
        """The measured peaks and headroom; the model states held against the memory model's
        (absent with an offload: on the host, where the model's device figure is 0)."""
        self.recorder.tags({K.TAG_MEM_SOURCE: derived.memory_source(agreed.peak_gib)})
        m = derived.memory_metrics(
            agreed.peak_gib, self.metrics[K.MEM_CAPACITY_GIB], self.metrics[K.MEM_ESTIMATE_TENSORS_GIB]
        )
        if agreed.states_bytes is not None:
            states = memory_estimate(self.cfg, on_gpu=self.device == "cuda").model_states
            m.update(
                derived.model_states_metrics(
                    agreed.states_bytes, states.params_bytes + states.optimizer_bytes
                )
            )
        return m

    def _log_restart(self, res: TrainResult) -> float | None:
        """This attempt's cold start and, after a stop, the restart in parts: one point per
        attempt, at its index. Returns the lost seconds (the previous attempt's steps past its
        last checkpoint, done again here), None when there was no restart to measure."""
        if Mark.FIRST_STEP_DONE not in res.timeline:
            return None
        step = len(self.prior)
        self.log(
            {K.RESTART_COLD_START_S: res.timeline[Mark.FIRST_STEP_DONE] - self.ctx.process_start}, step=step
        )
        prev = self.ctx.prev_stop
        if prev is None:
            return None
        restart = derived.breakdown(prev, self.ctx.process_start, res.timeline, res.start_step)
        self.log(restart.metrics(), step=step)
        self.recorder.tags({K.TAG_RESTART_REASON: restart.reason})
        return restart.lost_s(res.step_times)


def _quality(cfg: Any) -> Quality:
    """The quality bar: the target eval loss on real data; the loss bound on the synthetic task."""
    return Quality.for_data(cfg.data.kind)


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
            d,
            cfg.model.seq_len,
            method.name,
            method.lora_rank,
            method.target_modules,
            cfg.parallelism.micro_batch,
        )
        return flops, desc.non_embedding_params(d), None if ckpt else flops
    shape = ModelShape.of(cfg.model)
    return model_flops_per_token(shape), non_embedding_params(shape), hardware_flops_per_token(shape, ckpt)


def chat_counts(chat: ChatBatches) -> dict[str, float]:
    """A chat set's counts after masking and the seq_len fit (docs/data.md)."""
    d = chat.data
    m = {
        K.DATA_SAMPLES: float(len(d.train)),
        K.DATA_LOSS_TOKENS: float(d.train.loss_tokens.sum()),
        K.DATA_EVAL_SAMPLES: float(len(d.eval)),
        K.DATA_EVAL_LOSS_TOKENS: float(d.eval.loss_tokens.sum()),
        K.DATA_TRAIN_TOKENS: float(d.train.positions.sum()),
        K.DATA_EVAL_TOKENS: float(d.eval.positions.sum()),
        K.DATA_TRUNCATED: float(d.truncated),
        K.DATA_DROPPED_OVERLONG: float(d.dropped_overlong),
        K.DATA_DROPPED_UNTRAINED: float(d.dropped_untrained),
    }
    fill = chat.train.fill()
    if fill is not None:
        m[K.DATA_PACK_FILL] = fill
    return m


def chat_rates(trainer: Trainer, step_p50_s: float | None) -> dict[str, float]:
    """Real and loss-bearing tokens per second (each step's mean count over the run's steps /
    the median step time, as perf/tokens_per_s counts positions) and the padding efficiency
    (real / positions); {} for other data or with no timed step."""
    counts = list(trainer.step_counts.values())
    if not counts:
        return {}
    positions = sum(c.positions for c in counts)
    real = sum(c.real for c in counts)
    m = {K.DATA_PADDING_EFFICIENCY: real / positions}
    if step_p50_s:
        m[K.DATA_REAL_TOKENS_PER_S] = real / len(counts) / step_p50_s
        m[K.DATA_LOSS_TOKENS_PER_S] = sum(c.loss for c in counts) / len(counts) / step_p50_s
    return m
