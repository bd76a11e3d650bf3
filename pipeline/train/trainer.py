"""The DeepSpeed ZeRO fine-tune of one run. Knows nothing of Hydra, submitit or MLflow: it gets
plain config sections, a metrics sink, hooks and a stop flag; disabled features are null
objects, so the loop never branches on config."""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from pipeline.config.dsconfig import ds_config
from pipeline.config.schema import (
    DataConfig,
    MethodConfig,
    ModelConfig,
    ParallelismConfig,
    PrecisionConfig,
    TrainConfig,
)
from pipeline.data.packing import Counts
from pipeline.measure.timeline import Mark
from pipeline.tracking import keys as K
from pipeline.train.checkpoint import CheckpointManager, LoadStats, SaveStats
from pipeline.train.data import Batches, DataSource, NullBatches, StepSampler
from pipeline.train.model import ParamCounts, build_model, check_method, count_params
from pipeline.train.probes import state_fingerprint, sync
from pipeline.train.progress import CHECKPOINT, STARTING, TRAINING, NullProgress, Progress

CLIENT_KEY = "slurm_qualify"  # our state inside DeepSpeed's client_state (run id, losses, ...)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class UnsupportedPrecision(RuntimeError):
    """The device cannot train at this precision (fp16 on a CPU): a result, not a crash."""


class MetricsSink(Protocol):
    """Where the trainer's per-step series go (the job's recorder, pipeline.job.recorder)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...


class NullSink:
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass


class StepHook(Protocol):
    def after_step(self, trainer: Trainer, step: int) -> None: ...


class InStepHook(Protocol):
    """Runs inside the step's compute window, before its first forward (the straggler drill)."""

    def in_step(self, trainer: Trainer, step: int) -> None: ...


class ComputeClock:
    """This rank's forward time per step on its own device, free of waits for other ranks under
    ZeRO 0-2 (no collective runs in their forward): CUDA events on a GPU (read after the step's
    sync, so the loop never waits for them); on a CPU, the CPU time of the rank's thread (torch
    computes on it with one thread per rank), which waiting for a core on a busy host does not
    inflate."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self._parts: list[Any] = []

    def start(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.thread_time()

    def stop(self, start: Any) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._parts.append((start, end))
        else:
            self._parts.append(time.thread_time() - start)

    def take_s(self) -> float:
        """The step's total, after its sync; resets the clock."""
        parts, self._parts = self._parts, []
        if self.cuda:
            return sum(a.elapsed_time(b) for a, b in parts) / 1000
        return float(sum(parts))


class StopFlag:
    """Set by a signal handler (and nothing else happens in the handler); read at step
    boundaries, where the ranks agree on it with a collective."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_time: float | None = None
        self.signal_name: str = ""

    def set(self, name: str = "") -> None:
        if self.signal_time is None:
            self.signal_time = time.time()
            self.signal_name = name
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to `timeout_s`, less if the flag is set meanwhile; whether it is set."""
        return self._event.wait(timeout_s)


class DistComm:
    """The collectives the checkpoint manager needs, over torch.distributed: the default
    process group, or `group` (the checkpoint's own gloo group, see checkpoint_group)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def barrier(self) -> None:
        dist.barrier(group=self.group)

    def all_ok(self, ok: bool) -> bool:
        t = torch.tensor([0 if ok else 1], dtype=torch.int64)
        if dist.get_backend(self.group) == "nccl":
            t = t.cuda()
        dist.all_reduce(t, group=self.group)
        return int(t.item()) == 0

    def gather_obj(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_obj(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


_CHECKPOINT_GROUP: list[Any] = []


def checkpoint_group() -> Any:
    """A gloo group of all ranks, for the agreement and commit of a save in a background thread
    (a collective must not run on the training's group from another thread while training
    runs its own). Created once per process, by every rank at the same point (a collective)."""
    if not _CHECKPOINT_GROUP:
        _CHECKPOINT_GROUP.append(dist.new_group(backend="gloo"))
    return _CHECKPOINT_GROUP[0]


def build_ds_config(par: ParallelismConfig, prec: PrecisionConfig, train: TrainConfig) -> dict[str, Any]:
    """The DeepSpeed config, derived from the typed sections (never written by hand); offloaded
    states pinned when there is a GPU."""
    return ds_config(par, prec, train, pin_memory=torch.cuda.is_available())


def build_engine(
    model_cfg: ModelConfig,
    par: ParallelismConfig,
    train: TrainConfig,
    ds_config: dict[str, Any],
    method: MethodConfig | None = None,
    timings: dict[str, float] | None = None,
    progress: Progress | None = None,
) -> Any:
    """A fresh DeepSpeed engine: same seed, same init on every rank and every attempt.
    Without offload the optimizer is torch's AdamW, which makes resume bit-exact. Only the
    trainable parameters (all, or the adapters) have optimizer state. `timings` gets
    model_build_s (the model, on the host) and engine_init_s (deepspeed.initialize)."""
    import deepspeed

    progress = progress or NullProgress()
    dtype = torch.bfloat16 if ds_config.get("bf16", {}).get("enabled") else torch.float32
    progress.phase(STARTING, "building the model")
    t0 = time.perf_counter()
    model = build_model(
        model_cfg,
        method,
        par.activation_checkpointing,
        seed=train.seed,
        ds_config=ds_config,
        compute_dtype=dtype,
    )
    if timings is not None:
        timings["model_build_s"] = time.perf_counter() - t0
    progress.phase(
        STARTING, "the DeepSpeed engine (an op not built at install, e.g. CPU Adam, is compiled here)"
    )
    t0 = time.perf_counter()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = None
    if "optimizer" not in ds_config:
        optimizer = torch.optim.AdamW(
            trainable, lr=train.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=train.weight_decay
        )
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=optimizer, model_parameters=trainable, config=ds_config
    )
    if timings is not None:
        timings["engine_init_s"] = time.perf_counter() - t0
    return engine


def check_precision(prec: PrecisionConfig) -> None:
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    supported = {"fp32": True, "bf16": acc.is_bf16_supported(), "fp16": acc.is_fp16_supported()}
    if not supported[prec.name]:
        raise UnsupportedPrecision(
            f"{prec.name} is not supported on {acc.device_name()} ({type(acc).__name__})"
        )


@dataclass
class RoundTrip:
    """A checkpoint saved, restored into a fresh engine and compared by state hashes."""

    save: SaveStats
    load: LoadStats
    verified: bool


@dataclass
class TrainResult:
    start_step: int  # the step this attempt resumed from (0: fresh)
    end_step: int  # the last step done
    losses: dict[int, float] = field(default_factory=dict)  # step -> global mean loss
    step_times: dict[int, float] = field(default_factory=dict)  # step -> seconds (this attempt)
    forward_times: dict[int, float] = field(default_factory=dict)  # step -> this rank's forward seconds
    stopped: bool = False  # a stop was requested and honoured (saved, not finished)
    load: LoadStats | None = None
    roundtrips: list[RoundTrip] = field(default_factory=list)
    timeline: dict[str, float] = field(default_factory=dict)  # wall-clock marks of this attempt
    data_wait: dict[int, float] = field(default_factory=dict)  # step -> seconds waited for batches
    eval_losses: dict[int, float] = field(default_factory=dict)  # step -> held-out loss (0: before step 1)
    eval_s: float = 0.0  # seconds spent evaluating in this attempt
    startup: dict[str, float] = field(default_factory=dict)  # model_build_s, engine_init_s, ckpt_load_s
    skipped_checkpoints: int = 0  # checkpoints the resume skipped (failed verification), loaded one or not
    resume_note: str = ""  # the sentence that says so ("" when none was skipped)


class Trainer:
    """Owns the engine and the loop. Call `setup()` (engine + resume), then `train()`."""

    def __init__(
        self,
        model_cfg: ModelConfig,
        precision: PrecisionConfig,
        parallelism: ParallelismConfig,
        train_cfg: TrainConfig,
        rank: int,
        world_size: int,
        device: str,
        checkpoints: CheckpointManager,
        sink: MetricsSink | None = None,
        hooks: Sequence[StepHook] = (),
        stop: StopFlag | None = None,
        client_state: Mapping[str, Any] | None = None,
        data_world: int | None = None,
        data: DataConfig | None = None,
        method: MethodConfig | None = None,
        in_step_hooks: Sequence[InStepHook] = (),
        progress: Progress | None = None,
    ) -> None:
        """data_world: the ranks the samples of a step are laid out for (default: this run's).
        A run resumed on fewer ranks sees the same samples: each of its ranks takes the
        micro-batches of data_world / world_size original ranks, one after the other."""
        self.model_cfg, self.precision, self.par, self.cfg = model_cfg, precision, parallelism, train_cfg
        self.rank, self.world_size, self.device = rank, world_size, device
        self.checkpoints = checkpoints
        self.comm = DistComm()  # the default group's collectives, for hooks that must agree
        self.sink: MetricsSink = sink or NullSink()
        self.progress: Progress = progress or NullProgress()  # phase, step k of n, pace
        self.hooks = list(hooks)
        self.in_step_hooks = list(in_step_hooks)
        self.clock = ComputeClock(device)
        self.stop = stop or StopFlag()
        self.client_state = dict(client_state or {})  # stored with every checkpoint (run id, ...)
        self.method = method or MethodConfig()
        # adapters: the checkpoint holds what the run changed (adapters, their optimizer state);
        # the frozen base is rebuilt from the seed or the pretrained folder on resume
        self.checkpoints.adapters_only = self.method.adapters
        self.params: ParamCounts | None = None  # counted on the built model
        self.ds_config = build_ds_config(parallelism, precision, train_cfg)
        self.data = DataSource(
            data or DataConfig(),
            model_cfg.vocab_size,
            model_cfg.seq_len,
            train_cfg.seed,
            parallelism.micro_batch,
            pin=device == "cuda",
        )
        self.batches: Batches = NullBatches()
        self.tokens_per_step: float = (
            parallelism.micro_batch * parallelism.grad_accum * world_size * model_cfg.seq_len
        )
        self.engine: Any = None
        self.result = TrainResult(start_step=0, end_step=0)
        self.data_world = data_world or world_size
        if self.data_world % world_size or parallelism.grad_accum % (self.data_world // world_size):
            raise ValueError(
                f"a {world_size}-rank run with grad_accum={parallelism.grad_accum} cannot replay the samples "
                f"of {self.data_world} ranks"
            )
        self.step_counts: dict[int, Counts] = {}  # chat: each step's positions, real and loss tokens
        if self.data.chat is not None:
            chat = self.data.chat
            self.step_counts = {
                s: chat.step_counts(s, parallelism.grad_accum, world_size, self.data_world)
                for s in range(1, train_cfg.steps + 1)
            }
            self.tokens_per_step = statistics.fmean(c.positions for c in self.step_counts.values())

    # --- set-up --------------------------------------------------------------------------
    def _check_supported(self) -> None:
        """The precision and method run on this device and ZeRO layout (else a recorded result)."""
        check_precision(self.precision)
        par = self.par
        check_method(self.method, self.device, DTYPES[self.precision.name], par.zero_stage, par.offload_param)

    def setup(self) -> TrainResult:
        """Build the engine and resume from the newest good checkpoint, if any."""
        self._check_supported()
        self.engine = self._build_engine(self.ds_config)
        self.result.timeline[Mark.ENGINE_READY] = time.time()
        self.progress.phase(STARTING, "loading the checkpoint (if there is one)")
        t0 = time.perf_counter()
        load = self.checkpoints.load_latest(self.engine)
        if load is not None:
            self._resume_from(load)
        self.result.skipped_checkpoints = len(self.checkpoints.skipped)
        self.result.resume_note = self.checkpoints.resume_note(load)
        self.result.startup["ckpt_load_s"] = time.perf_counter() - t0
        self.result.timeline[Mark.LOAD_DONE] = time.time()
        self._start_batches()
        return self.result

    def setup_universal(self, folder: Path, tag: str) -> TrainResult:
        """Build the engine and load DeepSpeed's universal checkpoint `folder/tag` (converted
        by ds_to_universal from a run on any number of ranks)."""
        self._check_supported()
        universal = {**self.ds_config, "checkpoint": {"load_universal": True}}  # this engine's load only
        self.engine = self._build_engine(universal)
        self.result.timeline[Mark.ENGINE_READY] = time.time()
        t0 = time.perf_counter()
        _, client_state = self.engine.load_checkpoint(
            str(folder), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        step = int((client_state or {}).get(CLIENT_KEY, {}).get("step", 0))
        if not step:
            raise RuntimeError(f"no step in the universal checkpoint {folder / tag}")
        nbytes = sum(p.stat().st_size for p in (folder / tag).rglob("*") if p.is_file())
        self._resume_from(LoadStats(step, tag, time.perf_counter() - t0, nbytes, 0, client_state or {}))
        self.result.startup["ckpt_load_s"] = time.perf_counter() - t0
        self.result.timeline[Mark.LOAD_DONE] = time.time()
        self._start_batches()
        return self.result

    def _start_batches(self) -> None:
        """The loader over this run's remaining steps: the batches the uninterrupted run saw."""
        first = self.result.start_step + 1
        sampler = StepSampler(
            first, self.cfg.steps, self.rank, self.world_size, self.data_world, self.par.grad_accum
        )
        self.batches = self.data.batches(sampler)

    def _build_engine(self, ds_config: dict[str, Any]) -> Any:
        engine = build_engine(
            self.model_cfg, self.par, self.cfg, ds_config, self.method, self.result.startup, self.progress
        )
        self.params = count_params(engine.module)
        return engine

    def _resume_from(self, load: LoadStats) -> None:
        self.result.load = load
        self.result.start_step = self.result.end_step = load.step
        ours = load.client_state.get(CLIENT_KEY, {})
        self.result.losses.update({int(k): v for k, v in ours.get("losses", {}).items()})
        self.result.eval_losses.update({int(k): v for k, v in ours.get("eval_losses", {}).items()})
        self.client_state.update({k: v for k, v in ours.items() if k not in ("losses", "eval_losses")})

    # --- the loop ------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[float, bool]:
        """One optimizer step; returns the global mean loss and whether any rank must stop."""
        loss_sum = torch.zeros((), device=self.device)
        wait = 0.0
        # chat: summed NLL over the step's loss-bearing tokens (all micro-batches, all ranks)
        # divided by their count; DeepSpeed averages the micro-batches' losses over grad_accum x
        # ranks, so each is divided by count / (grad_accum x ranks)
        denominator = (
            self.step_counts[step].loss / (self.par.grad_accum * self.world_size)
            if self.step_counts
            else None
        )
        for micro in range(self.par.grad_accum):
            batch, waited = self.batches.next()  # the sampler's keys: (step, micro, rank) in order
            wait += waited
            t = self.clock.start()
            if micro == 0:
                for hook in self.in_step_hooks:
                    hook.in_step(self, step)
            if isinstance(batch, dict):
                on = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
                loss = self.engine(**on, denominator=denominator)
            else:
                x, y = batch
                loss = self.engine(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))
            self.clock.stop(t)
            self.engine.backward(loss)
            if micro == self.par.grad_accum - 1:  # the optimizer update: a save's state is on the host
                self.checkpoints.before_update()
            self.engine.step()
            loss_sum += loss.detach().float()
        # the loss and the stop flag agreed in one collective per step
        buf = torch.stack(
            [loss_sum / self.par.grad_accum, torch.tensor(float(self.stop.is_set()), device=self.device)]
        )
        dist.all_reduce(buf)
        self.result.data_wait[step] = wait
        return float(buf[0]) / self.world_size, bool(buf[1] > 0)

    def evaluate(self, step: int) -> float:
        """The mean loss per token on the held-out windows, split over the ranks; every rank
        runs the same number of forwards (ZeRO-3 gathers parameters in each)."""
        self.progress.phase(TRAINING, f"evaluating the held-out loss at step {step}")
        t0 = time.perf_counter()
        if self.data.chat is not None:
            value = self._evaluate_chat()
            self.result.eval_losses[step] = value
            self.result.eval_s += time.perf_counter() - t0
            self.sink.log_metrics({K.EVAL_LOSS: value}, step=step)
            return value
        x_all, y_all = self.data.eval_set()
        mine = range(self.rank, len(x_all), self.world_size)
        mb = self.par.micro_batch
        per_rank = math.ceil(len(x_all) / self.world_size)
        n_batches = math.ceil(per_rank / mb)
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # sum of batch losses x rows, rows
        self.engine.eval()
        with torch.no_grad():
            for b in range(n_batches):
                rows = list(mine[b * mb : (b + 1) * mb])
                weight = len(rows)
                rows = rows or [0]  # a rank with no window left still runs the forward, weighted 0
                loss = self.engine(x_all[rows].to(self.device), y_all[rows].to(self.device))
                total += torch.stack(
                    [
                        loss.detach().double() * weight,
                        torch.tensor(float(weight), device=self.device, dtype=torch.float64),
                    ]
                )
        self.engine.train()
        dist.all_reduce(total)
        value = float(total[0] / total[1])
        self.result.eval_losses[step] = value
        self.result.eval_s += time.perf_counter() - t0
        self.sink.log_metrics({K.EVAL_LOSS: value}, step=step)
        return value

    def _evaluate_chat(self) -> float:
        """Summed NLL over the loss-bearing tokens of the whole held-out split / their count,
        whatever the batching or packing: micro-batch i on rank i mod ranks; every rank runs
        the same number of forwards (a rank with none left reruns its first, weighted 0)."""
        assert self.data.chat is not None
        batches = self.data.chat.eval_batches()
        mine = batches[self.rank :: self.world_size]
        rounds = math.ceil(len(batches) / self.world_size)
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # summed NLL, loss-bearing tokens
        self.engine.eval()
        with torch.no_grad():
            for i in range(rounds):
                batch, weight = (mine[i], 1.0) if i < len(mine) else (batches[0], 0.0)
                on = {k: v.to(self.device) for k, v in batch.items()}
                nll = self.engine(**on, denominator=1.0).detach().double()
                count = (on["targets"] != -100).sum().double()
                total += torch.stack([nll, count]) * weight
        self.engine.train()
        dist.all_reduce(total)
        return float(total[0] / total[1])

    def _should_eval(self, step: int) -> bool:
        every = self.cfg.eval_every
        return step == self.cfg.steps or (every > 0 and step % every == 0)

    def train(self) -> TrainResult:
        try:
            res = self._train()
            self.checkpoints.wait()  # the last interval save is committed (or its failure raised)
            return res
        finally:
            self.batches.close()

    def _train(self) -> TrainResult:
        res = self.result
        if res.start_step == 0 and 0 not in res.eval_losses:
            self.evaluate(0)  # the first evaluation: the basis of a relative target
        self.progress.phase(STARTING, "the first step")
        for step in range(res.start_step + 1, self.cfg.steps + 1):
            t0 = time.perf_counter()
            loss, stop = self.train_step(step)
            sync(self.device)
            dt = time.perf_counter() - t0
            res.losses[step], res.step_times[step], res.end_step = loss, dt, step
            res.forward_times[step] = self.clock.take_s()
            self.progress.step(step, self.cfg.steps, dt)
            if Mark.FIRST_STEP_DONE not in res.timeline:
                res.timeline[Mark.FIRST_STEP_DONE] = time.time()
            self.sink.log_metrics(
                {K.TRAIN_LOSS: loss, K.PERF_STEP_TIME_S: dt, K.DATA_WAIT_S: res.data_wait[step]}, step=step
            )
            if self._should_eval(step):
                self.evaluate(step)
            for hook in self.hooks:
                hook.after_step(self, step)
            last = step == self.cfg.steps
            if stop and not last:
                self.save(step)  # waits for the save in flight, then saves this step, committed
                res.stopped = True
                res.timeline[Mark.STOP_SAVED] = time.time()
                break
            if self.checkpoints.should_save(step, last_step=False) and not last:
                self.save(step, blocking=False)  # written and committed while training goes on
        return res

    # --- checkpoints ---------------------------------------------------------------------
    def save(self, step: int, blocking: bool = True) -> SaveStats:
        """Save this step; blocking returns once it is committed, else once the state is on
        the host (the commit follows in the background; the next save waits for it)."""
        self.progress.phase(CHECKPOINT, f"saving step {step}")
        ours = {
            **self.client_state,
            "step": step,
            "losses": {str(k): v for k, v in self.result.losses.items()},
            "eval_losses": {str(k): v for k, v in self.result.eval_losses.items()},
        }
        return self.checkpoints.save(self.engine, step, {CLIENT_KEY: ours}, blocking=blocking)

    def roundtrip(self, step: int) -> RoundTrip:
        """Save at `step`, restore into a fresh engine, compare state hashes on every rank,
        and go on with the restored engine (so training continues from what was loaded)."""
        saved = self.save(step)
        self.progress.phase(
            CHECKPOINT, f"round trip of step {step}: restoring into a fresh engine, comparing"
        )
        before = state_fingerprint(self.engine)
        fresh = self._build_engine(self.ds_config)
        self.engine = None
        load = self.checkpoints.load_latest(fresh)
        assert load is not None, "a checkpoint that was just committed could not be loaded"
        after = state_fingerprint(fresh)
        verified = self.comm.all_ok(before == after and load.step == step)
        self.engine = fresh
        trip = RoundTrip(save=saved, load=load, verified=verified)
        self.result.roundtrips.append(trip)
        return trip


class CheckpointDrill:
    """drill.checkpoint: a verified round trip after a given step."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def after_step(self, trainer: Trainer, step: int) -> None:
        if step == self.at_step and step < trainer.cfg.steps:
            trainer.roundtrip(step)


def run_dir_checkpoints(run_dir: Path, train: TrainConfig, rank: int, world: int) -> CheckpointManager:
    return CheckpointManager(
        run_dir / "checkpoints",
        train.checkpoint_interval,
        train.keep_last,
        rank,
        world,
        DistComm(),
        io=train.checkpoint_io,
        commit_comm=DistComm(checkpoint_group()),
    )
