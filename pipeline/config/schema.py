"""Typed configuration: one dataclass per config group, registered with Hydra's ConfigStore.

The docstring under each field is the only description of a key: its meaning, unit and allowed
values (`qualify list --keys` prints them; the YAML files state values only). The schema is
registered as the base of each group, so a misspelt key or a value of the wrong type fails at
composition, before anything is submitted. Ranges and cross-field rules live in `__post_init__`
(and the rules that need the cluster or the machine in `pipeline.config.validate`); both raise
`ConfigError` with one paragraph naming the key and the allowed values.
"""

from __future__ import annotations

import math
import os.path
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pipeline import drills
from pipeline.config.checks import ConfigError as ConfigError
from pipeline.config.checks import number as _number
from pipeline.config.checks import require as _require
from pipeline.config.container import ContainerConfig as ContainerConfig
from pipeline.config.container import mount_parts as mount_parts
from pipeline.home import RUNS_DIR
from pipeline.measure.kinds import ARCHS as ARCHS
from pipeline.measure.kinds import CHAT_FORMATS as CHAT_FORMATS
from pipeline.measure.kinds import FAMILIES as FAMILIES
from pipeline.measure.kinds import METHODS as METHODS
from pipeline.measure.kinds import OVERLONG as OVERLONG
from pipeline.measure.kinds import PACKINGS as PACKINGS
from pipeline.measure.kinds import PRECISIONS as PRECISIONS
from pipeline.measure.kinds import TRAIN_ON as TRAIN_ON
from pipeline.tracking.keys import EXPERIMENT
from pipeline.tracking.redact import DEFAULT_SECRET_PATTERNS

# The enumerated config values, each declared once: the ones the measurements share live in
# pipeline.measure.kinds (re-exported here); the rest are the config's own. Each is a Literal and
# its tuple of values; the fields stay `str` (OmegaConf's structured configs take no Literal).
OffloadDevice = Literal["none", "cpu"]
OFFLOAD_DEVICES: tuple[str, ...] = get_args(OffloadDevice)
CheckpointIO = Literal["direct", "buffered", "deepspeed"]  # how checkpoint files are written
CHECKPOINT_IO: tuple[str, ...] = get_args(CheckpointIO)
LauncherChoice = Literal["auto", "local", "slurm"]  # "auto" resolves to a pipeline.sched.LauncherKind
LAUNCHERS: tuple[str, ...] = get_args(LauncherChoice)
PreemptMode = Literal["requeue", "cancel"]  # what a partition does to a preempted job
PREEMPT_MODES: tuple[str, ...] = get_args(PreemptMode)
DataKind = Literal["synthetic", "tokens", "text", "chat"]
DATA_KINDS: tuple[str, ...] = get_args(DataKind)
TokenDtype = Literal["uint16", "uint32"]
TOKEN_DTYPES: tuple[str, ...] = get_args(TokenDtype)
Weights = Literal["auto", "pretrained", "random"]
WEIGHTS: tuple[str, ...] = get_args(Weights)
MAX_STEPS = 10**7  # a fine-tune of ten million optimizer steps is a typo, not a qualification
# a name that becomes part of a folder, a run name or a Slurm job name
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
# Slurm's names (partition, account, qos, GRES type): letters, digits, _ . -
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# sbatch --constraint: features joined with & | , * and grouped with [] () (man sbatch)
SLURM_CONSTRAINT = re.compile(r"[A-Za-z0-9_.\-&|,*\[\]()!:]+")
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")


MLFLOW_MAX_EXPERIMENT_NAME = 500  # mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH


def _tracking_uri_usable(uri: str) -> None:
    """A URI of a known scheme that names nothing (`sqlite:///`, `http://`) is refused here:
    the sweep would go ledger-only and `make sync` could never send anything."""
    from urllib.parse import urlsplit

    from pipeline.tracking.redact import strip_userinfo

    shown, scheme = strip_userinfo(uri), uri.split(":", 1)[0].lower()
    if scheme == "sqlite":
        path = uri[len("sqlite:///") :] if uri.lower().startswith("sqlite:///") else ""
        _require(
            bool(path.strip()) and not path.endswith("/"),
            "tracking.uri",
            shown,
            "sqlite:///<path to a database file>, e.g. sqlite:////data/mlruns.db (four slashes for an "
            "absolute path); the URI given names no file",
        )
    elif scheme in ("http", "https"):
        try:
            parts = urlsplit(uri)
            ok = bool(parts.hostname) and (parts.port is None or 0 < parts.port < 65536)
        except ValueError:
            ok = False
        _require(ok, "tracking.uri", shown, f"{scheme}://host:port with a host name and a port in 1-65535")


def _plain(key: str, value: str | None) -> None:
    """No control characters (a newline would start a new sbatch line or shell command)."""
    if value is not None:
        bad = [c for c in value if unicodedata.category(c) in ("Cc", "Zl", "Zp")]
        _require(not bad, key, value, "text without control characters (newline, tab, escape ...)")


def _match(key: str, value: str | None, pattern: re.Pattern[str], allowed: str) -> None:
    if value is not None:
        _plain(key, value)
        _require(pattern.fullmatch(value) is not None, key, value, allowed)


def _label(key: str, value: str) -> None:
    _match(key, value, LABEL, "a name of letters, digits and _ . + - (it names folders and runs)")


def _slurm(key: str, value: str | None) -> None:
    _match(key, value, SLURM_NAME, "a Slurm name of letters, digits and _ . - (or null)")


@dataclass
class ModelConfig:
    """The causal LM: a preset shape built with Hugging Face transformers (random init), or your
    own model (model.pretrained: a local folder or a cached hub name)."""

    name: str = "tiny"
    """Model label in run and folder names (the option of the `model` group)."""
    arch: str = "llama"
    """llama (RMSNorm, SwiGLU, RoPE, GQA) | gpt2 (LayerNorm, GELU, learned positions)."""
    n_layers: int = 2
    """Transformer blocks, >= 1."""
    hidden: int = 64
    """Model width, a multiple of n_heads."""
    n_heads: int = 4
    """Attention heads, >= 1."""
    n_kv_heads: int = 4
    """Key/value heads, a divisor of n_heads (grouped-query attention when < n_heads)."""
    ffn_hidden: int = 128
    """MLP inner width, >= 1."""
    vocab_size: int = 256
    """Tokens in the vocabulary, >= 2."""
    seq_len: int = 64
    """Tokens per sequence, >= 2 (a next-token loss needs two)."""
    tie_embeddings: bool = False
    """The output layer shares the token embedding's weight (GPT-2, Llama-3.2-1B: true;
    Llama-2: false). A tied head is one tensor, counted once in the parameters."""
    family: str | None = None
    """transformers model_type built with AutoModelForCausalLM.from_config: llama | gpt2 | mistral |
    qwen2; null: model.arch. Read from config.json when model.pretrained is set."""
    pretrained: str | None = None
    """A local folder with config.json (save_pretrained; *.safetensors optional) or a hub name in the
    local Hugging Face cache; its config.json replaces the shape fields above and model.name."""
    weights: str = "auto"
    """auto (the folder's safetensors when there are any, else random init) | pretrained | random."""

    def __post_init__(self) -> None:
        if self.pretrained:
            self._from_pretrained(self.pretrained)
        _require(self.weights in WEIGHTS, "model.weights", self.weights, " | ".join(WEIGHTS))
        if self.pretrained is None:
            _require(
                self.weights != "pretrained",
                "model.weights",
                self.weights,
                "auto | random without model.pretrained",
            )
            _require(
                self.family in (None, *FAMILIES),
                "model.family",
                self.family,
                " | ".join(FAMILIES) + " or null",
            )
        _label("model.name", self.name)
        _require(self.arch in ARCHS, "model.arch", self.arch, " | ".join(ARCHS))
        for key in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden"):
            value = getattr(self, key)
            _require(value > 0, f"model.{key}", value, "a positive integer")
        _require(self.vocab_size >= 2, "model.vocab_size", self.vocab_size, "an integer >= 2")
        _require(self.seq_len >= 2, "model.seq_len", self.seq_len, "an integer >= 2")
        _require(self.hidden % self.n_heads == 0, "model.hidden", self.hidden, "a multiple of model.n_heads")
        _require(
            self.n_heads % self.n_kv_heads == 0,
            "model.n_kv_heads",
            self.n_kv_heads,
            "a divisor of model.n_heads",
        )

    def _from_pretrained(self, pretrained: str) -> None:
        from pipeline.config.pretrained import PretrainedError, read_pretrained

        try:
            info = read_pretrained(pretrained)
        except PretrainedError as e:
            raise ConfigError(str(e)) from e
        if self.weights == "pretrained" and not info.has_weights:
            raise ConfigError(
                f"Invalid value for 'model.weights': 'pretrained', but {info.folder} has no *.safetensors weights. "
                "Allowed: random (or auto), or a folder saved with save_pretrained(safe_serialization=True)."
            )
        self.family = info.family  # every number of the model then comes from its description
        self.name = Path(pretrained.rstrip("/")).name
        for key in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size"):
            setattr(self, key, getattr(info, key))
        if info.max_positions is not None:
            _require(
                self.seq_len <= info.max_positions,
                "model.seq_len",
                self.seq_len,
                f"at most the model's max_position_embeddings ({info.max_positions})",
            )

    @property
    def model_type(self) -> str:
        """The transformers model_type this config builds."""
        return self.family or self.arch

    @property
    def loads_weights(self) -> bool:
        """Whether the run starts from the pretrained folder's weights (else: random init)."""
        if self.pretrained is None or self.weights == "random":
            return False
        if self.weights == "pretrained":
            return True
        from pipeline.config.pretrained import read_pretrained

        return read_pretrained(self.pretrained).has_weights

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


@dataclass
class MethodConfig:
    """How the weights are tuned: all of them, or low-rank adapters (peft LoRA) on a frozen base."""

    name: str = "full"
    """full (every weight trained) | lora (adapters on a frozen base) | qlora (adapters on a 4-bit
    NF4 base through bitsandbytes)."""
    lora_rank: int = 8
    """r of LoRA: the rank of each adapter (a positive integer)."""
    lora_alpha: int = 16
    """LoRA scaling numerator: adapters are scaled by alpha / rank."""
    lora_dropout: float = 0.0
    """Dropout on the adapter input, 0 <= p < 1 (0 keeps resume bit-exact: no RNG in the step)."""
    target_modules: list[str] = field(default_factory=list)
    """Module names the adapters wrap; empty: every linear layer of the family (q_proj ... down_proj;
    c_attn, c_proj, c_fc for GPT-2)."""

    def __post_init__(self) -> None:
        _require(self.name in METHODS, "method.name", self.name, " | ".join(METHODS))
        _require(
            isinstance(self.lora_rank, int) and self.lora_rank >= 1,
            "method.lora_rank",
            self.lora_rank,
            "a positive integer",
        )
        _require(self.lora_alpha > 0, "method.lora_alpha", self.lora_alpha, "a positive number")
        _require(0 <= self.lora_dropout < 1, "method.lora_dropout", self.lora_dropout, "0 <= p < 1")

    @property
    def adapters(self) -> bool:
        return self.name != "full"

    def cannot_run_with(self, zero_stage: int, offload_param: str) -> str | None:
        """Why this method cannot run at this ZeRO layout (None: it can). QLoRA: ZeRO-3 and
        parameter offload partition or move the base weights, which bitsandbytes' 4-bit
        Params4bit (uint8 storage with its quantization state) does not survive."""
        if self.name == "qlora" and (zero_stage == 3 or offload_param != "none"):
            return (
                f"method=qlora needs parallelism.zero_stage 0, 1 or 2 without parameter offload (is "
                f"{zero_stage}, offload_param={offload_param}): the 4-bit base is not sharded"
            )
        return None

    @property
    def label(self) -> str:
        """full, or the method and its rank (lora-r8): what a candidate name shows."""
        return self.name if not self.adapters else f"{self.name}-r{self.lora_rank}"


@dataclass
class PrecisionConfig:
    name: str = "fp32"
    """fp32 | bf16 | fp16: the dtype of weights and matmuls (bf16/fp16 keep fp32 master weights)."""

    def __post_init__(self) -> None:
        _require(self.name in PRECISIONS, "precision.name", self.name, " | ".join(PRECISIONS))


CPU_RANKS_PER_NODE = 2
"""Ranks per node on CPU when parallelism.gpus_per_node is unset: two gloo processes, the
smallest world that exercises ZeRO's partitioning and its collectives."""


@dataclass
class ParallelismConfig:
    """How much: ZeRO stage, offload, batch shape and the GPUs and nodes of one run."""

    name: str = "zero2"
    """Label in run and folder names (the option of the `parallelism` group)."""
    zero_stage: int = 2
    """ZeRO stage: 0 (plain DDP), 1 (optimizer states), 2 (+gradients), 3 (+parameters)."""
    offload_optimizer: str = "none"
    """none | cpu: optimizer states and step on the host (ZeRO 1-3)."""
    offload_param: str = "none"
    """none | cpu: parameters on the host (ZeRO-3 only)."""
    micro_batch: int = 4
    """Sequences per rank per micro-step, >= 1."""
    grad_accum: int = 1
    """Micro-steps per optimizer step, >= 1."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward."""
    gpus_per_node: int | None = None
    """Ranks per node, >= 1: one per GPU (on CPU, one process each). Unset (null): every GPU of
    one node of a GPU partition (`partition.gpus_per_node`), CPU_RANKS_PER_NODE on CPU."""
    nodes: int = 1
    """Nodes of one run, >= 1 (more than 1 needs the Slurm launcher)."""

    def __post_init__(self) -> None:
        _label("parallelism.name", self.name)
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
            if value is None and key == "gpus_per_node":
                continue  # the partition's: Config fills it in
            _require(1 <= value <= 2**20, f"parallelism.{key}", value, "an integer >= 1 (and <= 2**20)")

    def fill_ranks(self, partition: PartitionConfig) -> None:
        """An unset gpus_per_node becomes the partition's GPUs per node (a GPU partition: a job
        uses its nodes whole), else CPU_RANKS_PER_NODE."""
        if self.gpus_per_node is None:
            whole = partition.is_gpu and partition.gpus_per_node >= 1
            self.gpus_per_node = partition.gpus_per_node if whole else CPU_RANKS_PER_NODE

    @property
    def per_node(self) -> int:
        """Ranks per node, once the partition filled an unset gpus_per_node (Config does)."""
        if self.gpus_per_node is None:
            raise ValueError("parallelism.gpus_per_node is unset until the partition fills it (fill_ranks)")
        return self.gpus_per_node

    @property
    def world_size(self) -> int:
        return self.per_node * self.nodes


@dataclass
class PartitionConfig:
    """Where, and what it costs: a Slurm partition and its hardware and dated price."""

    name: str = "local"
    """Label in run and folder names (the option of the `partition` group)."""
    slurm_partition: str | None = None
    """sbatch --partition, a Slurm partition name; null: not Slurm, the local executor runs the job."""
    slurm_cluster: str | None = None
    """The Slurm cluster the partition lives on (its ClusterName), when it is not the login
    node's own: one that shares this login node's slurmdbd, reached with `--clusters`/`-M`
    (docs/clusters.md section 10); null: the cluster of the login node's slurm.conf."""
    gpu_type: str = "cpu"
    """GRES type as in gres.conf (--gres=gpu:<type>:N), or cpu for CPU-only runs."""
    gpus_per_node: int = 0
    """GPUs per node on this partition, >= 0 (0: CPU ranks; checked against the cluster)."""
    gpu_mem_gib: float = 0.0
    """Memory per GPU, GiB, >= 0 (0: unknown, or a CPU partition: the host's memory is used)."""
    cpus_per_task: int = 1
    """CPU cores per rank, >= 1."""
    mem_gb_per_node: float | None = None
    """Host memory asked of Slurm, GB per node, > 0; null: Slurm's default."""
    node_mem_gb: float | None = None
    """Host memory a node of this hardware has, GB, > 0 (what a provider sells; the memory
    model's host limit when mem_gb_per_node is null, never asked of Slurm); null: unknown."""
    time_limit_min: int = 30
    """Wall-time limit per attempt, minutes, >= 1."""
    max_time_min: int | None = None
    """The partition's MaxTime, minutes, >= 1 (scontrol show partition); null: unknown."""
    account: str | None = None
    """sbatch --account, a Slurm name; null: none given."""
    qos: str | None = None
    """sbatch --qos, a Slurm name; null: none given."""
    constraint: str | None = None
    """sbatch --constraint: features joined with & | , and grouped with [ ]; null: none."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run before the job (module load ...), one line each, no control characters."""
    preempt_mode: str = "requeue"
    """What the partition does to a preempted job: requeue | cancel."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    """Dense peak per device, TFLOP/s > 0, keyed by precision; absent: unknown (no MFU)."""
    peak_source: str = ""
    """Datasheet the peaks come from."""
    price_usd_per_gpu_hour: float | None = None
    """USD per GPU-hour (per CPU rank-hour on CPU), >= 0; null: unknown (no cost)."""
    price_date: str = ""
    """Date of the price snapshot, YYYY-MM-DD (or empty)."""
    price_source: str = ""
    """Where the price comes from."""
    interruptions_per_gpu_hour: float | None = None
    """Unexpected job interruptions per GPU-hour on this partition, finite >= 0, for the
    projection to a production run; null: the Llama 3 figure (419 in 54 days on 16,384 GPUs,
    about 1.97e-5), stated as assumed in the report."""
    interruptions_source: str = ""
    """Where the interruption rate comes from (the site's own logs, say)."""
    nics_per_node: int | None = None
    """Network adapters a node has for training traffic, >= 1, for the projection's inter-node
    level; null: the datasheet of gpu_type (pipeline/measure/fabric.py), stated as assumed."""
    nic_gbps: float | None = None
    """Line rate of one of those adapters, Gb/s, > 0; null: the datasheet's, stated as assumed."""
    container: ContainerConfig = field(default_factory=ContainerConfig)
    """The image the ranks run in (Slurm OCI, Pyxis, Apptainer) or none: pipeline.config.container."""

    def __post_init__(self) -> None:
        if self.interruptions_per_gpu_hour is not None:
            _number("partition.interruptions_per_gpu_hour", self.interruptions_per_gpu_hour, lo=0)
        if self.nics_per_node is not None:
            _require(
                self.nics_per_node >= 1, "partition.nics_per_node", self.nics_per_node, "an integer >= 1"
            )
        if self.nic_gbps is not None:
            _number("partition.nic_gbps", self.nic_gbps, lo=0, above=True)
        _label("partition.name", self.name)
        if self.slurm_partition is not None:
            # sbatch takes a comma-separated list of partitions
            for part in self.slurm_partition.split(","):
                _match(
                    "partition.slurm_partition", part, SLURM_NAME, "Slurm partition names, comma-separated"
                )
        _match(
            "partition.gpu_type",
            self.gpu_type,
            SLURM_NAME,
            "a GRES type of letters, digits and _ . -, or cpu",
        )
        _require(self.gpus_per_node >= 0, "partition.gpus_per_node", self.gpus_per_node, "an integer >= 0")
        _number("partition.gpu_mem_gib", self.gpu_mem_gib, lo=0)
        _require(self.cpus_per_task >= 1, "partition.cpus_per_task", self.cpus_per_task, "an integer >= 1")
        for key in ("mem_gb_per_node", "node_mem_gb"):
            if getattr(self, key) is not None:
                _number(f"partition.{key}", getattr(self, key), lo=0, above=True)
        _require(self.time_limit_min >= 1, "partition.time_limit_min", self.time_limit_min, "an integer >= 1")
        if self.max_time_min is not None:
            _require(
                self.max_time_min >= 1, "partition.max_time_min", self.max_time_min, "an integer >= 1 or null"
            )
        _slurm("partition.account", self.account)
        _slurm("partition.slurm_cluster", self.slurm_cluster)
        _slurm("partition.qos", self.qos)
        _match(
            "partition.constraint",
            self.constraint,
            SLURM_CONSTRAINT,
            "Slurm features with & | , [ ] (or null)",
        )
        for line in self.setup:
            _plain("partition.setup", line)
        _require(
            self.preempt_mode in PREEMPT_MODES,
            "partition.preempt_mode",
            self.preempt_mode,
            " | ".join(PREEMPT_MODES),
        )
        for prec, value in self.peak_tflops.items():
            _require(prec in PRECISIONS, "partition.peak_tflops", prec, " | ".join(PRECISIONS) + " as keys")
            _number(f"partition.peak_tflops.{prec}", value, lo=0, above=True)
        if self.price_usd_per_gpu_hour is not None:
            _number("partition.price_usd_per_gpu_hour", self.price_usd_per_gpu_hour, lo=0)
        _require(
            self.price_date == "" or re.fullmatch(r"\d{4}-\d{2}-\d{2}", self.price_date) is not None,
            "partition.price_date",
            self.price_date,
            "a date YYYY-MM-DD, or empty",
        )
        for key in ("peak_source", "price_source"):
            _plain(f"partition.{key}", getattr(self, key))

    @property
    def is_gpu(self) -> bool:
        return self.gpu_type != "cpu"


def _with_drill_sections(cls: type) -> type:
    """Give the drill section's class one field per drill (pipeline.drills), its options
    dataclass, before it becomes a dataclass: the schema states no drill by hand."""
    for spec in drills.SPECS:
        cls.__annotations__[spec.name] = spec.options
        setattr(cls, spec.name, field(default_factory=spec.options))
    return cls


@dataclass
@_with_drill_sections
class DrillConfig:
    """Failure drills of a point; `drill=[checkpoint,preempt]` enables several at once. Besides
    these two fields, one section per drill of pipeline.drills, `drill.<name>`, its options."""

    reference: bool = True
    """After an interrupted run, replay it uninterrupted and compare every step's loss."""
    loss_tolerance: float = 0.0
    """|resumed - reference| allowed per step, >= 0; 0: bit-exact (torch AdamW)."""

    if TYPE_CHECKING:  # the sections, added from the registry, as the type checker sees them

        def __getattr__(self, name: str) -> Any: ...

    def sections(self) -> dict[str, Any]:
        """Each drill's section by name, in drill order (pipeline.drills: one module each)."""
        return {s.name: getattr(self, s.name) for s in drills.SPECS}

    def interrupting(self) -> list[str]:
        """The drills that stop the job and need a resume."""
        return drills.interrupting(self)

    def enabled_names(self) -> list[str]:
        return [s.name for s in drills.enabled(self)]

    def __post_init__(self) -> None:
        _number("drill.loss_tolerance", self.loss_tolerance, lo=0)


@dataclass
class TrainConfig:
    """The fine-tune itself: steps, optimizer, data and the quality bar."""

    steps: int = 20
    """Optimizer steps to reach (the run's target), in [1, 10**7]."""
    warmup_steps: int = 3
    """First steps excluded from the timing statistics (and counted), in [0, steps)."""
    lr: float = 3e-3
    """AdamW learning rate, finite > 0."""
    weight_decay: float = 0.0
    """AdamW weight decay, finite >= 0."""
    grad_clip: float = 1.0
    """Gradient-norm clipping threshold, finite >= 0; 0 disables it."""
    seed: int = 1234
    """Seed of init and data, in [0, 2**32): same seed, same run, bit for bit."""
    loss_bound_frac: float = 0.9
    """Accepted only if final loss < this x initial loss (ln vocab), in (0, 1]."""
    checkpoint_interval: int = 0
    """Save every N optimizer steps, >= 0; 0: only the final (verified) save."""
    keep_last: int = 2
    """Checkpoints kept on disk, >= 1."""
    checkpoint_io: str = "direct"
    """direct (O_DIRECT, buffered where the filesystem refuses it) | buffered (page cache)
    | deepspeed (its own writer, files read back to hash)."""
    measure_ceiling: bool = True
    """Measure a matmul ceiling for MFU (the only ceiling on CPU)."""
    measure_comm: bool = True
    """Measure all-reduce / all-gather bus bandwidth at the job's scale."""
    reuse_probes_s: float = 3600.0
    """A restart after a stop for a requeue (preempted, timed out, terminated) on the same nodes,
    ranks, device and precision reuses the ceiling and bandwidth its point measured up to this
    many seconds before, instead of measuring them again (`sq.probes` says which); 0: always
    measure. A restart after a peer failure always measures. The node health gate runs on
    every attempt."""
    comm_sizes_mb: list[float] = field(default_factory=lambda: [1.0, 4.0, 16.0])
    """Message sizes of the collective measurements, MB, each finite > 0 and <= 65536."""
    eval_every: int = 10
    """Evaluate on the held-out split every N optimizer steps (also before the first step and
    after the last), >= 0; 0: only before the first and after the last."""
    skip_if_no_fit: bool = True
    """Record does_not_fit without running when the memory model says the point cannot fit."""
    pg_timeout_s: int = 120
    """Process-group timeout, seconds, >= 1: a hung peer fails the job after this."""

    def __post_init__(self) -> None:
        _require(
            1 <= self.steps <= MAX_STEPS, "train.steps", self.steps, f"an integer in [1, {MAX_STEPS:.0e}]"
        )
        _require(
            0 <= self.warmup_steps < self.steps,
            "train.warmup_steps",
            self.warmup_steps,
            "0 <= warmup_steps < train.steps",
        )
        _number("train.lr", self.lr, lo=0, above=True)
        _number("train.weight_decay", self.weight_decay, lo=0)
        _number("train.grad_clip", self.grad_clip, lo=0)
        _require(0 <= self.seed < 2**32, "train.seed", self.seed, "an integer in [0, 2**32)")
        _number("train.loss_bound_frac", self.loss_bound_frac, lo=0, hi=1, above=True)
        _require(self.checkpoint_interval >= 0, "train.checkpoint_interval", self.checkpoint_interval, ">= 0")
        _require(self.keep_last >= 1, "train.keep_last", self.keep_last, ">= 1")
        _require(self.eval_every >= 0, "train.eval_every", self.eval_every, "an integer >= 0 (steps)")
        _require(
            self.checkpoint_io in CHECKPOINT_IO,
            "train.checkpoint_io",
            self.checkpoint_io,
            " | ".join(CHECKPOINT_IO),
        )
        for size in self.comm_sizes_mb:
            _number("train.comm_sizes_mb", size, lo=0, hi=65536, above=True)
        _require(
            bool(self.comm_sizes_mb) or not self.measure_comm,
            "train.comm_sizes_mb",
            self.comm_sizes_mb,
            "at least one size while train.measure_comm is true",
        )
        _require(self.pg_timeout_s >= 1, "train.pg_timeout_s", self.pg_timeout_s, "an integer >= 1 (seconds)")
        _require(
            math.isfinite(self.reuse_probes_s) and self.reuse_probes_s >= 0,
            "train.reuse_probes_s",
            self.reuse_probes_s,
            "seconds, finite and >= 0 (0: measure on every attempt)",
        )


@dataclass
class DataConfig:
    """What the run trains and evaluates on (pipeline.train.data)."""

    name: str = "synthetic"
    """The preset's name."""
    kind: str = "synthetic"
    """synthetic (a counting task made in memory) | tokens (a flat binary file of token ids) |
    text (jsonl or plain-text files and a local tokenizer, tokenized once into a token file) |
    chat (chat or instruction samples through the tokenizer's chat template, docs/data.md)."""
    path: str | None = None
    """tokens: the token file; text: a .jsonl/.txt file or a folder of them. Null for synthetic."""
    dtype: str = "uint16"
    """data=tokens: the width of one token id in the file, uint16 | uint32 (text picks it)."""
    tokenizer: str | None = None
    """data=text, data=chat: a local tokenizer folder (tokenizer.json, as save_pretrained writes it)."""
    text_key: str = "text"
    """data=text, jsonl files: the field holding each document's text."""
    format: str = "auto"
    """data=chat: auto | messages | sharegpt | alpaca | prompt_completion (the record's fields)."""
    messages_field: str | None = None
    """data=chat: the field of the message list (null: messages, or conversations for sharegpt)."""
    chat_template: str | None = None
    """data=chat: a Jinja chat template file (null: the tokenizer folder's own)."""
    train_on: str = "assistant"
    """data=chat: the tokens the loss is taken on, assistant | last (assistant turn) | all."""
    packing: str = "pad"
    """data=chat: pad (to the longest of the micro-batch) | pack (bins of model.seq_len)."""
    group_by_length: bool = False
    """data=chat, packing=pad: micro-batches of samples of similar length."""
    overlong: str = "truncate"
    """data=chat: a sample longer than model.seq_len + 1 tokens, truncate | drop | refuse."""
    alphabet: int = 32
    """data=synthetic: the distinct tokens of the counting task (ids 0..alphabet-1, capped at the
    vocabulary), >= 2. Fixed rather than the whole vocabulary, so the task is equally hard for
    every model size and the loss bound (train.loss_bound_frac x ln V) is within reach of
    adapters on a frozen base."""
    eval_frac: float = 0.1
    """Fraction of the tokens held out at the end of the file for evaluation, 0 < x < 1."""
    eval_sequences: int = 16
    """Held-out sequences of model.seq_len tokens scored at each evaluation (fewer if the
    held-out tail is shorter)."""
    num_workers: int = 0
    """DataLoader worker processes per rank (0: batches are made in the training process; the
    tokens and text presets read with 2)."""
    prefetch_factor: int = 2
    """Micro-batches each worker reads ahead (num_workers > 0)."""
    probe_batches: int = 32
    """Micro-batches read through the loader before training to measure its read throughput
    (tokens/s, MB/s); 0 skips the probe."""

    def __post_init__(self) -> None:
        _require(self.kind in DATA_KINDS, "data.kind", self.kind, " | ".join(DATA_KINDS))
        _require(self.dtype in TOKEN_DTYPES, "data.dtype", self.dtype, " | ".join(TOKEN_DTYPES))
        _require(0 < self.eval_frac < 1, "data.eval_frac", self.eval_frac, "a fraction, 0 < x < 1")
        for key in ("eval_sequences", "prefetch_factor"):
            value = getattr(self, key)
            _require(value >= 1, f"data.{key}", value, "an integer >= 1")
        _require(self.alphabet >= 2, "data.alphabet", self.alphabet, "an integer >= 2")
        for key in ("num_workers", "probe_batches"):
            value = getattr(self, key)
            _require(value >= 0, f"data.{key}", value, "an integer >= 0")
        if self.kind != "synthetic":
            _require(bool(self.path), "data.path", self.path, f"a file or folder path with data={self.kind}")
        else:
            for key in ("path", "tokenizer"):
                _require(
                    getattr(self, key) is None,
                    f"data.{key}",
                    getattr(self, key),
                    f"null with data=synthetic (it generates its data and reads no file); for data.{key} to "
                    "be read, choose data=tokens (a token file) or data=text (text and a tokenizer)",
                )
        if self.kind in ("text", "chat"):
            _require(
                bool(self.tokenizer),
                "data.tokenizer",
                self.tokenizer,
                f"a local tokenizer folder with data={self.kind}",
            )
        for key, allowed in (
            ("format", CHAT_FORMATS),
            ("train_on", TRAIN_ON),
            ("packing", PACKINGS),
            ("overlong", OVERLONG),
        ):
            _require(getattr(self, key) in allowed, f"data.{key}", getattr(self, key), " | ".join(allowed))


@dataclass
class AcceptConfig:
    """The quality target a point must reach to be accepted (data=tokens and data=text)."""

    target_eval_loss: float = 0.9
    """The held-out loss to reach within train.steps: nats per token, or with `relative` a
    fraction of the first evaluation's loss (before the first step)."""
    relative: bool = True
    """true: target_eval_loss is a fraction (0 < x < 1) of the first evaluation's loss."""

    def __post_init__(self) -> None:
        ok = isinstance(self.target_eval_loss, int | float) and self.target_eval_loss > 0
        _require(ok, "accept.target_eval_loss", self.target_eval_loss, "a positive number")
        if self.relative:
            _require(
                self.target_eval_loss < 1,
                "accept.target_eval_loss",
                self.target_eval_loss,
                "a fraction 0 < x < 1 of the first evaluation's loss with accept.relative=true",
            )

    def target(self, first_eval_loss: float) -> float:
        """The eval loss to reach, nats per token."""
        return self.target_eval_loss * first_eval_loss if self.relative else self.target_eval_loss


@dataclass
class TrackingConfig:
    enabled: bool = True
    """false: nothing is sent to MLflow (benchmarks of the logging cost)."""
    uri: str | None = None
    """MLflow tracking URI: sqlite:///<path>, http(s)://host:port or a database URI;
    null: sqlite:///<project>/mlruns.db. MLflow 3 has no file store (file:// is refused)."""
    experiment: str = EXPERIMENT
    """MLflow experiment name, not empty."""
    flush_every_s: float = 5.0
    """Metrics are buffered and flushed in the background this often, seconds, finite >= 0.1."""
    redact_patterns: list[str] = field(default_factory=lambda: list(DEFAULT_SECRET_PATTERNS))
    """Params, tags and artifacts: the value of a key with a word matching one of these
    patterns (fnmatch, any case) is logged as ***."""
    secrets: list[str] = field(default_factory=list)
    """Values you mark secret, each at least 4 characters: written as *** wherever they appear
    (manifest, config.yaml, ledgers, MLflow params, tags and artifacts), besides secret keys'
    values and credential-shaped text (docs/hardening.md)."""

    def __post_init__(self) -> None:
        if self.uri is not None:
            _plain("tracking.uri", self.uri)
            _tracking_uri_usable(self.uri)
            scheme = self.uri.split(":", 1)[0].lower() if ":" in self.uri else ""
            _require(
                scheme.split("+", 1)[0] in TRACKING_SCHEMES,
                "tracking.uri",
                self.uri,
                "sqlite:///<path>, http(s)://host:port or a database URI "
                f"({', '.join(TRACKING_SCHEMES)}), or null; MLflow 3 refuses the file store "
                "(file:// or a bare path): use sqlite:///<path>/mlruns.db",
            )
        _plain("tracking.experiment", self.experiment)
        _require(
            bool(self.experiment.strip()), "tracking.experiment", self.experiment, "a name that is not empty"
        )
        _require(
            len(self.experiment) <= MLFLOW_MAX_EXPERIMENT_NAME,
            "tracking.experiment",
            f"{self.experiment[:40]}... ({len(self.experiment)} characters)",
            f"a name of at most {MLFLOW_MAX_EXPERIMENT_NAME} characters (MLflow refuses longer ones, "
            "so the runs could never be sent)",
        )
        for value in self.secrets:
            _require(
                isinstance(value, str) and len(value) >= 4,
                "tracking.secrets",
                "***",
                "a list of values of at least 4 characters each (shorter ones would mask ordinary text)",
            )
        _number("tracking.flush_every_s", self.flush_every_s, lo=0.1)
        _require(
            all(isinstance(p, str) and p.strip() for p in self.redact_patterns),
            "tracking.redact_patterns",
            self.redact_patterns,
            "a list of non-empty fnmatch patterns, e.g. [password, token, secret, key]",
        )


@dataclass
class LauncherConfig:
    kind: str = "auto"
    """auto (Slurm when `sinfo` answers) | local (submitit's local executor) | slurm."""
    local_parallelism: int = 1
    """Local executor: points running at once, >= 1 (each point already uses several ranks)."""
    warm_ranks: bool = True
    """Local executor: fork each rank from one server that imported torch, transformers and
    DeepSpeed once per sweep (docs/design.md, "Warm ranks"); their runs are tagged sq.ranks=warm."""
    array_parallelism: int = 16
    """Slurm: array tasks of one resource group running at once, >= 1."""
    max_num_timeout: int = 3
    """Requeues allowed after time-outs, >= 0."""
    max_restarts: int = 5
    """Requeues allowed after preemptions and failed workers, >= 0."""
    signal_delay_s: int = 90
    """The warning signal comes this long before the time limit, seconds, >= 1 and under it."""
    wait: bool = False
    """Slurm: block until every point ended (local runs always wait)."""
    hold: bool = False
    """Slurm: submit held (sbatch --hold); jobs start after `scontrol release <id>`."""
    exclude_unhealthy: bool = False
    """A point whose node fails the health gate is submitted again without that node
    (sbatch --exclude), by the login node while `qualify` waits."""
    max_points: int = 1000
    """A sweep of more points than this is refused before any is composed, >= 1 (Slurm's default
    MaxArraySize is 1001); raise it on the command line to run a bigger sweep on purpose."""

    def __post_init__(self) -> None:
        _require(self.kind in LAUNCHERS, "launcher.kind", self.kind, " | ".join(LAUNCHERS))
        for key in ("local_parallelism", "array_parallelism", "signal_delay_s", "max_points"):
            value = getattr(self, key)
            _require(value >= 1, f"launcher.{key}", value, "an integer >= 1")
        for key in ("max_num_timeout", "max_restarts"):
            value = getattr(self, key)
            _require(value >= 0, f"launcher.{key}", value, "an integer >= 0")


@dataclass
class CostConfig:
    """Parameters of the cost model beyond compute (docs/design.md); GPU prices live in partition."""

    storage_usd_per_gb_month: float = 0.023
    """Checkpoint storage, USD per GB-month, >= 0 (default: an object-storage list price, AWS S3
    Standard's first 50 TB)."""
    retention_days: float = 30.0
    """Days a checkpoint is kept, >= 0."""
    egress_usd_per_gb: float = 0.0
    """Moving results out, USD per GB, >= 0."""
    orchestration_usd_per_run: float = 0.0
    """Scheduler / CI overhead per run, USD, >= 0."""
    labor_usd_per_hour: float = 120.0
    """Engineer rate for failures that need a person, USD per hour, >= 0."""
    labor_hours_per_failure: float = 0.5
    """Engineer time per failure that needs a person, hours, >= 0."""
    ship_checkpoints: bool = False
    """Checkpoints are copied off-site: every byte a point saves is billed as egress."""
    reusable_usd_per_verified_checkpoint: float = 0.0
    """USD of value per checkpoint that passed restore verification, subtracted from the cost,
    >= 0 (default 0: no value is claimed unless a team states one)."""

    electricity_usd_per_kwh: float | None = None
    """Electricity price, $/kWh (null: no energy cost). For on-premise clusters, where energy
    replaces the rental price."""
    pue: float = 1.0
    """Power usage effectiveness of the data centre (facility energy / IT energy), >= 1."""

    def __post_init__(self) -> None:
        for key in (
            "storage_usd_per_gb_month",
            "retention_days",
            "egress_usd_per_gb",
            "orchestration_usd_per_run",
            "labor_usd_per_hour",
            "labor_hours_per_failure",
            "reusable_usd_per_verified_checkpoint",
        ):
            _number(f"cost.{key}", getattr(self, key), lo=0)
        if self.electricity_usd_per_kwh is not None:
            _require(
                self.electricity_usd_per_kwh >= 0,
                "cost.electricity_usd_per_kwh",
                self.electricity_usd_per_kwh,
                "a price >= 0 in $/kWh, or null",
            )
        _require(1.0 <= self.pue <= 3.0, "cost.pue", self.pue, "a ratio 1.0 <= pue <= 3.0")


@dataclass
class SearchConfig:
    """The OOM-safe micro-batch search inside one allocation (pipeline/job/search.py)."""

    micro_batch: bool = False
    """Search the largest micro-batch that fits before the run; the run goes on at that size."""
    start: int = 0
    """First micro-batch tried (sequences per rank); 0: the memory model's largest at `headroom`, at least 1."""
    cap: int = 64
    """Largest micro-batch tried (sequences per rank)."""
    headroom: float = 0.15
    """Fraction of the device memory a size that fits must leave free at its measured peak (0 <= x < 1)."""
    steps: int = 2
    """Optimizer steps per trial; tokens/s is taken from the last one."""
    trial_timeout_s: int = 30
    """Seconds a rank waits in a trial's collective for its peers before the trial counts as failed on
    another rank (one that ran out of memory between two collectives); the run uses train.pg_timeout_s."""

    def __post_init__(self) -> None:
        _require(self.start >= 0, "search.start", self.start, "0 (from the memory model) or an integer >= 1")
        _require(self.cap >= 1, "search.cap", self.cap, "an integer >= 1")
        _require(0 <= self.headroom < 1, "search.headroom", self.headroom, "a fraction 0 <= x < 1")
        _require(self.steps >= 1, "search.steps", self.steps, "an integer >= 1")
        _require(self.trial_timeout_s >= 1, "search.trial_timeout_s", self.trial_timeout_s, "seconds >= 1")


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
    matmul_spread_source: str = (
        "ml-engineering (Stas Bekman), compute/accelerator: up to ~5% matmul TFLOPS spread measured "
        "between GPUs of one node; more is a suspect GPU"
    )
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
    """Preset name (the option of the `sweep` group)."""
    description: str = ""
    """One line shown with the sweep."""
    grid: dict[str, list[str]] = field(default_factory=dict)
    """Override key -> values; the points are the product of the axes."""
    extra: list[list[str]] = field(default_factory=list)
    """More points, each a list of overrides."""
    overrides: list[str] = field(default_factory=list)
    """Overrides applied to every point."""
    repeats: int = 1
    """Run every point this many times with seeds train.seed, train.seed + 1, ... (a sweep axis),
    in [1, 1000]; a seed list (train.seed=1,2,3) does the same with its seeds."""
    budget_usd: float | None = None
    """Refuse the sweep (exit 2, nothing submitted) when its estimate is over this many dollars, > 0;
    null: no cap (pipeline/submit/estimate.py)."""
    budget_gpu_hours: float | None = None
    """Refuse the sweep when its estimate is over this many GPU-hours (rank-hours on CPU), > 0; null: no cap."""
    adaptive: bool = False
    """Adaptive qualification (pipeline/submit/adaptive.py): one repeat of every candidate, then rounds
    of one more repeat only for the candidates whose interval still overlaps the best's, up to
    `repeats` each, while sweep.budget_* allow. On Slurm each round ends with a controller job
    (pipeline/submit/controller.py) that submits the next one; the login node never waits."""
    min_repeats: int = 1
    """sweep.adaptive: no candidate leaves the contention before it has this many runs, >= 1 and
    at most `repeats`. After one run a candidate's interval holds only its steps' spread, nothing of how
    runs differ (another node, placement, a neighbour's load): two runs of one configuration can
    differ more than its steps do. 2 drops a candidate only on an interval that has seen runs
    differ; 1 (the default) may drop it after its first run."""
    controller_partition: str | None = None
    """sweep.adaptive on Slurm: the Slurm partition of the controller jobs (one task, a few minutes,
    no GPU asked); null: the cheapest partition of the sweep (lowest price_usd_per_gpu_hour)."""
    controller_time_min: int = 10
    """sweep.adaptive on Slurm: the controller job's time limit in minutes, in [1, 120]."""

    def __post_init__(self) -> None:
        _label("sweep.name", self.name)
        _plain("sweep.description", self.description)
        _match("sweep.controller_partition", self.controller_partition, SLURM_NAME, "a Slurm partition name")
        _require(
            isinstance(self.min_repeats, int) and self.min_repeats >= 1,
            "sweep.min_repeats",
            self.min_repeats,
            "an integer >= 1, at most sweep.repeats (checked with sweep.adaptive)",
        )
        _require(
            isinstance(self.controller_time_min, int) and 1 <= self.controller_time_min <= 120,
            "sweep.controller_time_min",
            self.controller_time_min,
            "an integer number of minutes in [1, 120]",
        )
        for key in ("budget_usd", "budget_gpu_hours"):
            v = getattr(self, key)
            ok = v is None or (isinstance(v, int | float) and math.isfinite(v) and v > 0)
            _require(ok, f"sweep.{key}", v, "a positive number, or null for no cap")


# system folders a sweep must never write into (runs_dir), with their subfolders, except the
# places that hold users' and schedulers' data
SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
)
SYSTEM_DIRS_OPEN = ("/var/tmp", "/var/lib/slurm", "/var/spool")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The model (group `model`)."""
    method: MethodConfig = field(default_factory=MethodConfig)
    """How the model is fine-tuned: full, LoRA or QLoRA (group `method`)."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """The training precision (group `precision`)."""
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    """ZeRO stage, offload and batch shape (group `parallelism`)."""
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    """Where it runs and what it costs (group `partition`)."""
    drill: DrillConfig = field(default_factory=DrillConfig)
    """Failure drills (group `drill`; a list enables several)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The fine-tune: steps, optimizer, checkpoints, measurements."""
    data: DataConfig = field(default_factory=DataConfig)
    """What it trains and evaluates on (group `data`)."""
    accept: AcceptConfig = field(default_factory=AcceptConfig)
    """The quality target a point must reach to be accepted (data=tokens|text)."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """MLflow."""
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    """How points are submitted and requeued."""
    cost: CostConfig = field(default_factory=CostConfig)
    """Cost model beyond compute (group `cost`)."""
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    """Hardware sampling and the straggler measurement."""
    health: HealthConfig = field(default_factory=HealthConfig)
    """The pre-flight node health gate."""
    sweep: SweepConfig = field(default_factory=SweepConfig)
    """The sweep preset (group `sweep`)."""
    search: SearchConfig = field(default_factory=SearchConfig)
    """The micro-batch search inside one allocation (search.micro_batch=true)."""
    runs_dir: str = RUNS_DIR
    """Folder for manifests, job logs and checkpoints, relative to the project home unless
    absolute; a writable folder, never a system path (/, /etc, /usr ...)."""

    def __post_init__(self) -> None:
        self.parallelism.fill_ranks(self.partition)
        _plain("runs_dir", self.runs_dir)
        _require(bool(self.runs_dir.strip()), "runs_dir", self.runs_dir, "a folder path that is not empty")
        _require(
            not is_system_path(self.runs_dir),
            "runs_dir",
            self.runs_dir,
            "a folder of your own, not / or a system path (" + ", ".join(SYSTEM_DIRS[:6]) + " ...)",
        )
        if self.drill.kill_worker.enabled:
            _require(
                self.train.checkpoint_interval > 0,
                "train.checkpoint_interval",
                self.train.checkpoint_interval,
                "> 0 with drill=kill_worker (the resumed job needs an interval checkpoint to resume from)",
            )
            kill = self.drill.kill_worker.at_step
            _require(  # without a restart (launcher.max_restarts=0) the kill only has to end the point
                self.train.checkpoint_interval < kill or self.launcher.max_restarts == 0,
                "train.checkpoint_interval",
                self.train.checkpoint_interval,
                f"fewer steps than drill.kill_worker.at_step={kill} with drill=kill_worker (no checkpoint would be "
                "committed before the kill: the job would restart at step 0 and prove nothing), or "
                "launcher.max_restarts=0 to see the point fail for good",
            )
        if self.drill.timeout.enabled:
            drill_min, part_min = self.drill.timeout.time_limit_min, self.partition.time_limit_min
            _require(
                drill_min < part_min,
                "drill.timeout.time_limit_min",
                drill_min,
                f"fewer minutes than partition.time_limit_min={part_min} (a drill limit at or above the "
                "partition's can never fire before it)",
            )
        limit_s = self.partition.time_limit_min * 60
        _require(
            self.launcher.signal_delay_s < limit_s,
            "launcher.signal_delay_s",
            self.launcher.signal_delay_s,
            f"fewer seconds than partition.time_limit_min x 60 = {limit_s}",
        )


def is_system_path(path: str) -> bool:
    """True for /, /etc, /usr/... and the other system folders (after resolving . and ..)."""
    if not path.startswith("/"):
        return False
    p = os.path.normpath(path)

    def under(d: str) -> bool:
        return p == d or p.startswith(d + "/")

    return p == "/" or (any(map(under, SYSTEM_DIRS)) and not any(map(under, SYSTEM_DIRS_OPEN)))
