"""Typed configuration: one dataclass per config group, registered with Hydra's ConfigStore.

Every field has a docstring-like comment with its unit. The schema is registered as the
base of each group, so a misspelt key or a value of the wrong type fails at composition,
before anything is submitted. Cross-field rules live in `__post_init__` and in
`pipeline.config.validate`; both raise `ConfigError` with one paragraph naming the key and the
allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PRECISIONS = ("fp32", "bf16", "fp16")
ARCHS = ("llama", "gpt2")
OFFLOAD_DEVICES = ("none", "cpu")
CHECKPOINT_IO = ("direct", "buffered", "deepspeed")  # how checkpoint files are written
LAUNCHERS = ("auto", "local", "slurm")
PREEMPT_TRIGGERS = ("signal", "urgent", "requeue", "local")


class ConfigError(ValueError):
    """A config point is invalid; the message is one paragraph a user can act on."""


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"Invalid value for '{key}': {value!r}. Allowed: {allowed}.")


@dataclass
class ModelConfig:
    """A decoder-only transformer, built with random init from these shapes."""

    name: str = "tiny"
    arch: str = "llama"  # llama (RMSNorm, SwiGLU, RoPE, GQA) | gpt2 (LayerNorm, GELU, learned pos)
    n_layers: int = 2  # transformer blocks
    hidden: int = 64  # model width
    n_heads: int = 4  # attention heads
    n_kv_heads: int = 4  # key/value heads (GQA when < n_heads)
    ffn_hidden: int = 128  # MLP inner width
    vocab_size: int = 256  # tokens
    seq_len: int = 64  # tokens per sequence

    def __post_init__(self) -> None:
        _require(self.arch in ARCHS, "model.arch", self.arch, " | ".join(ARCHS))
        for key in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "seq_len"):
            value = getattr(self, key)
            _require(value > 0, f"model.{key}", value, "a positive integer")
        _require(self.hidden % self.n_heads == 0, "model.hidden", self.hidden, "a multiple of model.n_heads")
        _require(
            self.n_heads % self.n_kv_heads == 0,
            "model.n_kv_heads",
            self.n_kv_heads,
            "a divisor of model.n_heads",
        )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


@dataclass
class PrecisionConfig:
    name: str = "fp32"  # fp32 | bf16 | fp16: the dtype of weights and matmuls

    def __post_init__(self) -> None:
        _require(self.name in PRECISIONS, "precision.name", self.name, " | ".join(PRECISIONS))


@dataclass
class ParallelismConfig:
    """How much: ZeRO stage, offload, batch shape and the GPUs and nodes of one run."""

    name: str = "zero2"
    zero_stage: int = 2  # 0 (plain DDP) .. 3
    offload_optimizer: str = "none"  # none | cpu: optimizer states (and step) on the CPU (ZeRO 1-3)
    offload_param: str = "none"  # none | cpu: parameters on the CPU (ZeRO 3 only)
    micro_batch: int = 4  # sequences per rank per micro-step
    grad_accum: int = 1  # micro-steps per optimizer step
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    gpus_per_node: int = 2  # ranks per node (one rank per GPU; CPU runs: one rank per process)
    nodes: int = 1  # nodes of one run

    def __post_init__(self) -> None:
        _require(self.zero_stage in (0, 1, 2, 3), "parallelism.zero_stage", self.zero_stage, "0, 1, 2 or 3")
        _require(
            self.offload_optimizer in OFFLOAD_DEVICES,
            "parallelism.offload_optimizer",
            self.offload_optimizer,
            " | ".join(OFFLOAD_DEVICES),
        )
        _require(
            self.offload_param in OFFLOAD_DEVICES,
            "parallelism.offload_param",
            self.offload_param,
            " | ".join(OFFLOAD_DEVICES),
        )
        if self.offload_optimizer != "none":
            _require(
                self.zero_stage >= 1,
                "parallelism.offload_optimizer",
                self.offload_optimizer,
                "none unless parallelism.zero_stage >= 1",
            )
        if self.offload_param != "none":
            _require(
                self.zero_stage == 3,
                "parallelism.offload_param",
                self.offload_param,
                "none unless parallelism.zero_stage == 3",
            )
        for key in ("micro_batch", "grad_accum", "gpus_per_node", "nodes"):
            value = getattr(self, key)
            _require(value >= 1, f"parallelism.{key}", value, "an integer >= 1")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass
class PartitionConfig:
    """Where, and what it costs: a Slurm partition and its hardware and dated price."""

    name: str = "local"
    slurm_partition: str | None = None  # Slurm partition name; null for the embedded default
    gpu_type: str = "cpu"  # GRES type (a100, h100, ...) or "cpu" for CPU-only runs
    gpus_per_node: int = 0  # GPUs per node on this partition (0: CPU ranks)
    gpu_mem_gib: float = 0.0  # memory per GPU, GiB (0 on CPU: the host's memory is used)
    cpus_per_task: int = 1  # CPU cores per rank
    mem_gb_per_node: float | None = None  # memory to ask Slurm for, GB per node (null: Slurm's default)
    time_limit_min: int = 30  # wall-time limit per attempt, minutes
    max_time_min: int | None = None  # the partition's MaxTime, minutes (checked before submission)
    account: str | None = None  # sbatch --account
    qos: str | None = None  # sbatch --qos
    constraint: str | None = None  # sbatch --constraint
    setup: list[str] = field(default_factory=list)  # shell lines run before the job (module load ...)
    preempt_mode: str = "requeue"  # what the partition does on preemption: requeue | cancel
    # peak dense FLOP/s per device, TFLOP/s, keyed by precision; absent: unknown (no MFU)
    peak_tflops: dict[str, float] = field(default_factory=dict)
    peak_source: str = ""  # datasheet the peaks come from
    price_usd_per_gpu_hour: float | None = None  # $/GPU-hour (per CPU rank-hour for CPU); null: unknown
    price_date: str = ""  # date of the price snapshot, YYYY-MM-DD
    price_source: str = ""  # where the price comes from

    def __post_init__(self) -> None:
        _require(self.time_limit_min >= 1, "partition.time_limit_min", self.time_limit_min, "an integer >= 1")
        _require(
            self.preempt_mode in ("requeue", "cancel"),
            "partition.preempt_mode",
            self.preempt_mode,
            "requeue | cancel",
        )
        for prec, value in self.peak_tflops.items():
            _require(prec in PRECISIONS, "partition.peak_tflops", prec, " | ".join(PRECISIONS) + " as keys")
            _require(value > 0, f"partition.peak_tflops.{prec}", value, "a positive TFLOP/s figure")

    @property
    def is_gpu(self) -> bool:
        return self.gpu_type != "cpu"


@dataclass
class CheckpointDrillConfig:
    enabled: bool = False  # save mid-run, restore into a fresh engine, compare state hashes
    at_step: int = 5  # optimizer step after which the round trip happens


@dataclass
class PreemptDrillConfig:
    enabled: bool = False  # preempt the job at a step; it must save, requeue and resume
    trigger: str = "signal"  # signal (scancel --signal=USR2 --full) | urgent | requeue | local
    at_step: int = 10  # optimizer step after which the preemption is triggered


@dataclass
class KillWorkerDrillConfig:
    enabled: bool = False  # SIGKILL one rank mid-run; the job fails, requeues and resumes
    at_step: int = 10
    rank: int = 1  # which rank is killed


@dataclass
class TimeoutDrillConfig:
    enabled: bool = False  # a time limit shorter than the run; save on the warning and requeue
    time_limit_min: int = 2  # the attempt's wall-time limit, minutes
    signal_delay_s: int = 60  # the warning (USR2) comes this long before the limit


@dataclass
class ReshapeDrillConfig:
    enabled: bool = False  # resume on another number of ranks through DeepSpeed's universal checkpoint
    at_step: int = 10  # the run saves after this step and goes on with `world_size` ranks
    world_size: int = 1  # ranks of the resumed run: divides the job's ranks, on its first node


@dataclass
class StragglerDrillConfig:
    enabled: bool = False
    """Slow one rank down inside every step; the straggler score must name it."""
    rank: int = 1
    """The rank that is slowed (0 .. world size - 1)."""
    fraction: float = 0.3
    """How much slower, as a fraction of the rank's own forward time (0.3: 30% slower)."""

    def __post_init__(self) -> None:
        _require(self.rank >= 0, "drill.straggler.rank", self.rank, "an integer >= 0")
        _require(0 < self.fraction <= 10, "drill.straggler.fraction", self.fraction, "0 < fraction <= 10")


@dataclass
class DrillConfig:
    name: str = "none"
    reference: bool = True  # after an interrupted run, replay it uninterrupted and compare every loss
    loss_tolerance: float = 0.0  # |resumed - reference| allowed per step; 0 = bit-exact (torch AdamW)
    checkpoint: CheckpointDrillConfig = field(default_factory=CheckpointDrillConfig)
    preempt: PreemptDrillConfig = field(default_factory=PreemptDrillConfig)
    kill_worker: KillWorkerDrillConfig = field(default_factory=KillWorkerDrillConfig)
    timeout: TimeoutDrillConfig = field(default_factory=TimeoutDrillConfig)
    reshape: ReshapeDrillConfig = field(default_factory=ReshapeDrillConfig)
    straggler: StragglerDrillConfig = field(default_factory=StragglerDrillConfig)
    """Slow one rank (pipeline/job/straggler.py)."""

    def interrupting(self) -> list[str]:
        """The drills that stop the job and need a resume."""
        return [n for n in ("preempt", "kill_worker", "timeout") if getattr(self, n).enabled]

    def enabled_names(self) -> list[str]:
        names = ("checkpoint", "preempt", "kill_worker", "timeout", "reshape", "straggler")
        return [n for n in names if getattr(self, n).enabled]

    def __post_init__(self) -> None:
        _require(
            self.preempt.trigger in PREEMPT_TRIGGERS,
            "drill.preempt.trigger",
            self.preempt.trigger,
            " | ".join(PREEMPT_TRIGGERS),
        )


@dataclass
class TrainConfig:
    """The fine-tune itself: steps, optimizer, data and the quality bar."""

    steps: int = 20  # optimizer steps to reach (the run's target)
    warmup_steps: int = 3  # first steps excluded from the timing statistics (and counted)
    lr: float = 3e-3  # AdamW learning rate
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # gradient-norm clipping, 0 disables
    seed: int = 1234
    loss_bound_frac: float = 0.9  # accepted only if final loss < this x initial loss (ln vocab)
    checkpoint_interval: int = 0  # save every N steps (0: only the final save)
    keep_last: int = 2  # checkpoints kept on disk
    checkpoint_io: str = "direct"  # direct (O_DIRECT) | buffered (page cache) | deepspeed (its own writer)
    measure_ceiling: bool = True  # measure a matmul ceiling for MFU (the only ceiling on CPU)
    measure_comm: bool = True  # all-reduce / all-gather bus bandwidth at the job's scale
    comm_sizes_mb: list[float] = field(default_factory=lambda: [1.0, 4.0, 16.0])  # message sizes, MB
    skip_if_no_fit: bool = True  # record does_not_fit without running when the memory model says so
    pg_timeout_s: int = 120  # process-group timeout: a hung peer fails the job after this

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "train.steps", self.steps, "an integer >= 1")
        _require(
            0 <= self.warmup_steps < self.steps,
            "train.warmup_steps",
            self.warmup_steps,
            "0 <= warmup_steps < train.steps",
        )
        _require(self.lr > 0, "train.lr", self.lr, "a positive float")
        _require(0 < self.loss_bound_frac <= 1, "train.loss_bound_frac", self.loss_bound_frac, "0 < x <= 1")
        _require(self.checkpoint_interval >= 0, "train.checkpoint_interval", self.checkpoint_interval, ">= 0")
        _require(self.keep_last >= 1, "train.keep_last", self.keep_last, ">= 1")
        _require(
            self.checkpoint_io in CHECKPOINT_IO,
            "train.checkpoint_io",
            self.checkpoint_io,
            " | ".join(CHECKPOINT_IO),
        )


@dataclass
class TrackingConfig:
    enabled: bool = True  # false: nothing is sent to MLflow (benchmarks of the logging cost)
    uri: str | None = None  # MLflow tracking URI; null: sqlite:///<project>/mlruns.db
    experiment: str = "slurm-qualify"  # MLflow experiment name
    flush_every_s: float = 5.0  # metrics are buffered and flushed in the background this often


@dataclass
class LauncherConfig:
    kind: str = "auto"  # auto (slurm when sinfo answers) | local | slurm
    local_parallelism: int = 1  # local executor: points running at once
    array_parallelism: int = 16  # Slurm: array tasks of one group running at once
    max_num_timeout: int = 3  # requeues allowed after a time-out
    max_restarts: int = 5  # requeues allowed after preemptions and failed workers
    signal_delay_s: int = 90  # the warning signal is sent this long before the time limit
    wait: bool = False  # block until every point ended (always true for the local executor)
    hold: bool = False  # Slurm: submit held (sbatch --hold); jobs start after `scontrol release`
    exclude_unhealthy: bool = False
    """A point whose node fails the health gate is submitted again without that node
    (sbatch --exclude), by the login node while `qualify` waits."""

    def __post_init__(self) -> None:
        _require(self.kind in LAUNCHERS, "launcher.kind", self.kind, " | ".join(LAUNCHERS))


@dataclass
class CostConfig:
    """Parameters of the cost model beyond compute (docs/design.md, "Cost")."""

    storage_usd_per_gb_month: float = 0.023  # checkpoint storage
    retention_days: float = 30.0  # how long checkpoints are kept
    egress_usd_per_gb: float = 0.0  # moving results out
    orchestration_usd_per_run: float = 0.0  # scheduler/CI overhead per run
    labor_usd_per_hour: float = 120.0  # engineer rate for failures that need a person
    labor_hours_per_failure: float = 0.5  # engineer time per failure that needs a person
    electricity_usd_per_kwh: float | None = None
    """Electricity price, $/kWh (null: no energy cost). For on-premise clusters, where energy
    replaces the rental price."""
    pue: float = 1.0
    """Power usage effectiveness of the data centre (facility energy / IT energy), >= 1."""

    def __post_init__(self) -> None:
        if self.electricity_usd_per_kwh is not None:
            _require(
                self.electricity_usd_per_kwh >= 0,
                "cost.electricity_usd_per_kwh",
                self.electricity_usd_per_kwh,
                "a price >= 0 in $/kWh, or null",
            )
        _require(1.0 <= self.pue <= 3.0, "cost.pue", self.pue, "a ratio 1.0 <= pue <= 3.0")


@dataclass
class TelemetryConfig:
    """What the hardware does while a run runs (pipeline/job/telemetry.py)."""

    enabled: bool = True
    """Sample GPUs (NVML) and hosts (psutil) on every node while the run trains."""
    interval_s: float = 5.0
    """Seconds between samples."""
    straggler_interval: int = 10
    """Optimizer steps between two gathers of the ranks' forward times (one all_gather each)."""

    def __post_init__(self) -> None:
        _require(
            0.05 <= self.interval_s <= 600, "telemetry.interval_s", self.interval_s, "0.05 .. 600 seconds"
        )
        _require(
            self.straggler_interval >= 1,
            "telemetry.straggler_interval",
            self.straggler_interval,
            "an integer >= 1",
        )


@dataclass
class HealthConfig:
    """The pre-flight gate of every node (pipeline/job/health.py); thresholds in conf/health/."""

    enabled: bool = True
    """Check every node before the fine-tune; a failed node ends the point as node_unhealthy."""
    matmul_spread_max: float = 0.05
    """Largest (fastest - slowest) / fastest matmul ceiling across one node's GPUs, a fraction."""
    matmul_spread_source: str = ""
    """Where the spread limit comes from."""
    busbw_min_gbps: dict[str, float] = field(default_factory=dict)
    """All-reduce bus bandwidth a node must reach, GB/s, keyed '<gpu_type>x<gpus per node>'."""
    busbw_source: str = ""
    """Where the bandwidth thresholds come from."""
    dcgm: bool = True
    """Run `dcgmi diag -r 1` where DCGM is installed."""

    def __post_init__(self) -> None:
        _require(
            0 < self.matmul_spread_max < 1, "health.matmul_spread_max", self.matmul_spread_max, "0 < x < 1"
        )
        for key, value in self.busbw_min_gbps.items():
            _require(value > 0, f"health.busbw_min_gbps.{key}", value, "a positive GB/s figure")


@dataclass
class SweepConfig:
    """A named grid: the product of `grid` axes, plus explicit `extra` points."""

    name: str = "default"
    description: str = ""
    grid: dict[str, list[str]] = field(default_factory=dict)  # override key -> values
    extra: list[list[str]] = field(default_factory=list)  # more points, each a list of overrides
    overrides: list[str] = field(default_factory=list)  # applied to every point


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    drill: DrillConfig = field(default_factory=DrillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    """Hardware sampling and the straggler measurement."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """The pre-flight node health gate."""
    sweep: SweepConfig = field(default_factory=SweepConfig)
    runs_dir: str = "runs"  # where sweeps write manifests, logs and checkpoints
