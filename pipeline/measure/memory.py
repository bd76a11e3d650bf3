"""Memory of a DeepSpeed ZeRO fine-tune, per device and per host node: every term, its source,
the verdict and the largest micro-batch that fits.

Pure functions, bytes everywhere (GiB = 2**30 only in messages). Psi = parameters, T = trainable
parameters (Psi for a full fine-tune), Nd = data-parallel ranks. Sources per term:

- model states: ZeRO (Rajbhandari et al. 2020, section 3.1, figure 1) as DeepSpeed 0.19
  really holds them. ZeRO-1/2 (deepspeed/runtime/zero/stage_1_and_2.py): the step casts the
  gradient partition to fp32 (`single_grad_partition ... .to(fp32)`), so mixed precision holds
  2Psi + (2 + 4 + 12)T/Nd, DeepSpeed's own estimator `estimate_zero2_model_states_mem_needs`.
  ZeRO-3 (deepspeed/runtime/zero/stage3.py): the 16-bit parameter partition (ds_tensor), the
  persistent 16-bit gradient partition buffer (`grad_partitions_flat_buffer`), the fp32 gradient
  of one optimizer sub-group at a time (`_prepare_fp32_grad_for_sub_group`, sub_group_size 1e9
  elements) and the fp32 master + Adam m, v partitions: (2 + 2 + 12)Psi/Nd + 4 min(Psi/Nd, 1e9).
  fp32 training keeps DeepSpeed's fp32 master copy of the partition too (measured on CPU).
- offload: ZeRO-Offload (Ren et al. 2021, section 4) / stage_1_and_2.py `cpu_offload`: the fp32
  master, m, v and fp32 gradients of the partition live on the host; ZeRO-3 with offload puts
  the gradient partition buffer in pinned host memory (stage3.py, `grad_partitions_flat_buffer`
  pinned when offloading) and, with offload_param, the 16-bit parameter partition too.
- initialisation: without `deepspeed.zero.Init` every rank builds the whole model in fp32 on the
  host before DeepSpeed partitions it (DeepSpeed's estimators, `zero_init=False`: 4 bytes x Psi x
  ranks per node); ZeRO-1/2 then moves the whole 16-bit model onto each device.
- activations: Korthikanti et al. 2022 (section 4.1, equation 1, no tensor parallelism): 34sbh
  per layer in 16-bit. The 5as^2b attention-score term is left out: the model uses
  scaled_dot_product_attention (pipeline/train/model.py), which does not store the scores
  (Dao et al. 2022, FlashAttention, section 3.1). Full activation checkpointing keeps each
  layer's input (2sbh) plus one layer's full set while it is recomputed (section 4.2).
- logits: Hugging Face-style causal LMs upcast the logits to fp32 for the cross-entropy, s*b*V*4,
  and its gradient has the same size during backward.
- communication: DeepSpeed's default buckets (deepspeed/runtime/zero/config.py):
  reduce_bucket_size 5e8 elements: ZeRO-1/2 (contiguous_gradients, stage_1_and_2.py `ipg_buffer`)
  and ZeRO-3 (its IPG bucket) allocate it whole, in the gradient dtype, whatever the model size; ZeRO-3 prefetch: stage3_prefetch_bucket_size 5e7 elements in flight
  plus the largest layer gathered (as `estimate_zero3_model_states_mem_needs`'s largest_layer).
- allocator slack: PyTorch's caching allocator rounds blocks and fragments; 10% of the rest.
- CUDA context, cuBLAS and NCCL workspaces outside the allocator: about 1 GiB per GPU.
- host: ranks per node x (what each rank holds on the host: its offloaded states, pinned
  buffers, its Python/torch runtime) + data-loader workers, against the node's memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from pipeline.measure.describe import ModelDescription, quantized_params
from pipeline.measure.flops import ModelShape, param_count
from pipeline.measure.kinds import METHODS, PRECISIONS


class Verdict(StrEnum):
    """The memory model's verdict on a point (docs/memory.md): by headroom, best first."""

    FITS = "fits"
    """Headroom >= 30%."""
    TIGHT = "tight"
    """15% <= headroom < 30%."""
    DOES_NOT_FIT = "does_not_fit"
    """Headroom < 15%, including over capacity."""


VERDICTS = tuple(Verdict)  # best first
HEADROOM_FITS = 0.30
HEADROOM_TIGHT = 0.15

GIB = 2**30
CUDA_CONTEXT_BYTES = GIB
"""CUDA context, cuBLAS and NCCL workspaces outside the caching allocator: 0.5-1 GiB per GPU on
A100/H100; the upper end. Zero on CPU."""
ALLOCATOR_SLACK_FRAC = 0.10
"""Caching-allocator rounding and fragmentation, as a fraction of everything else on the device."""
RANK_RUNTIME_HOST_BYTES = 2 * GIB
"""Host memory of one rank's process before any model: Python, torch, DeepSpeed, CUDA/NCCL host
buffers. Measured here: 0.9-1.2 GiB RSS for a CPU rank of the tiny model; 2 GiB with CUDA."""
LOADER_WORKER_HOST_BYTES = GIB // 2
"""One data-loader worker process (a fork of the rank: its own Python heap and batches)."""
REDUCE_BUCKET_ELEMS = 500_000_000
"""DeepSpeed's default reduce_bucket_size (deepspeed/runtime/zero/config.py)."""
PREFETCH_BUCKET_ELEMS = 50_000_000
"""DeepSpeed's default stage3_prefetch_bucket_size (deepspeed/runtime/zero/config.py)."""
SUB_GROUP_ELEMS = 1_000_000_000
"""DeepSpeed's default sub_group_size: ZeRO-3 steps (and holds fp32 gradients for) this many
elements of its partition at a time."""
PERSISTENCE_THRESHOLD = 100_000
"""stage3_param_persistence_threshold: ZeRO-3 keeps parameters this small whole on every rank."""
QLORA_BYTES_PER_PARAM = (4 + 0.127) / 8
"""NF4 with double quantisation: 4 bits + 0.127 bits of quantisation constants per parameter
(QLoRA, Dettmers et al. 2023, section 3 'Double Quantization')."""
LORA_TRAINABLE_FRAC = 0.01
"""Trainable share used by `advice` when no adapter size is given: rank-16 LoRA on every linear
layer of Llama-2-7B is 40M of 6.7B (0.6%); 1% is the conservative round number."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def weight_bytes(precision: str) -> int:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    return 4 if precision == "fp32" else 2


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes of one data-parallel rank: on its device, and on the host (offload)."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    cpu_bytes: int

    @property
    def device_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def model_states_bytes_per_device(
    params: int,
    zero_stage: int,
    dp_ranks: int,
    precision: str = "bf16",
    offload_optimizer: bool = False,
    offload_param: bool = False,
    method: str = "full",
    trainable_params: int | None = None,
    persistent_params: int = 0,
    sub_group_elems: int = SUB_GROUP_ELEMS,
    quantized_params: int | None = None,
) -> ModelStates:
    """Model states of one rank as DeepSpeed 0.19 holds them at the optimizer step (the peak).

    T = trainable_params (default: all for 'full', required for 'lora'/'qlora'); frozen weights
    (Psi - T) have no gradient and no optimizer state. w = 2 bytes (bf16/fp16) or 4 (fp32).
    - weights: ZeRO-0/1/2 w*Psi; ZeRO-3 w*Psi/Nd plus persistent_params kept whole
      (stage3_param_persistence_threshold). 'qlora': the quantized_params (default: all frozen
      base weights) at QLORA_BYTES_PER_PARAM, the rest at w.
    - grads: ZeRO-0 fp32: 4T; mixed: 2T + 4T (BF16_Optimizer's fp32 gradient accumulation,
      deepspeed/runtime/bf16_optimizer.py). ZeRO-1/2: the reduced partition, w*T/Nd, plus its fp32
      cast 4T/Nd in mixed precision (stage_1_and_2.py; fp32 needs no cast). ZeRO-3: the persistent
      partition buffer w*T/Nd + the fp32 gradient of one sub-group, 4 min(T/Nd, sub_group_elems).
    - optimizer: Adam m, v (8T) plus the fp32 master copy (4T) except at ZeRO-0 fp32 (torch AdamW
      on the fp32 weights themselves); sharded over Nd from ZeRO-1.
    offload_optimizer: optimizer states and fp32 gradients go to the host (ZeRO-3 also the
    gradient partition buffer, pinned); offload_param (ZeRO-3): the weight partition too.
    Partitions round up: DeepSpeed pads them to equal size.
    """
    _check_states_args(params, zero_stage, dp_ranks, offload_optimizer, offload_param, method)
    w = weight_bytes(precision)
    mixed = precision != "fp32"
    if trainable_params is None:
        if method != "full":
            raise ValueError(f"method {method!r} needs trainable_params (the adapter's parameters)")
        trainable_params = params
    t, nd = trainable_params, dp_ranks
    weights = _weight_bytes(params, t, nd, w, zero_stage, method, persistent_params, quantized_params)
    opt_whole = (12 if (mixed or zero_stage >= 1) else 8) * t
    optimizer = _ceil_div(opt_whole, nd) if zero_stage >= 1 else opt_whole
    grads16, grads32 = _grad_bytes(t, nd, w, mixed, zero_stage, sub_group_elems)
    host = 0
    if offload_optimizer:  # the fp32 gradients of the whole partition wait on the host
        grads32 = _ceil_div(4 * t, nd)
        host += optimizer + grads32 + (grads16 if zero_stage == 3 else 0)
        optimizer, grads16, grads32 = 0, 0, 0
    if offload_param:
        host += weights
        weights = w * persistent_params
    return ModelStates(weights, grads16 + grads32, optimizer, host)


def _check_states_args(
    params: int, zero_stage: int, dp_ranks: int, offload_optimizer: bool, offload_param: bool, method: str
) -> None:
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0-3, got {zero_stage}")
    if dp_ranks < 1 or params < 0:
        raise ValueError(f"need dp_ranks >= 1 and params >= 0, got {dp_ranks}, {params}")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3")
    if offload_param and zero_stage != 3:
        raise ValueError("offload_param needs ZeRO stage 3")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")


def _weight_bytes(
    params: int,
    t: int,
    nd: int,
    w: int,
    zero_stage: int,
    method: str,
    persistent_params: int,
    quantized_params: int | None,
) -> int:
    """One rank's weights on the device (before offload): see model_states_bytes_per_device."""
    if method == "qlora":
        quant = params - t if quantized_params is None else quantized_params
        weights_whole = int(quant * QLORA_BYTES_PER_PARAM) + w * (params - quant)
    else:
        weights_whole = w * params
    if zero_stage == 3:
        return _ceil_div(weights_whole, nd) + w * persistent_params * (nd - 1) // nd
    return weights_whole


def _grad_bytes(
    t: int, nd: int, w: int, mixed: bool, zero_stage: int, sub_group_elems: int
) -> tuple[int, int]:
    """(gradient bytes at the weights' precision, fp32 gradient bytes) of one rank, before offload."""
    if zero_stage == 0:
        return w * t, (4 * t if mixed else 0)
    if zero_stage in (1, 2):
        return _ceil_div(w * t, nd), (_ceil_div(4 * t, nd) if mixed else 0)
    return _ceil_div(w * t, nd), 4 * min(_ceil_div(t, nd), sub_group_elems)


def activation_bytes_per_device(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    n_heads: int,
    n_layers: int,
    bytes_per_elem: int = 2,
    activation_checkpointing: bool = False,
    stores_scores: bool = False,
) -> int:
    """Activations kept for backward (Korthikanti et al. 2022, equation 1, no tensor parallelism).

    Per layer, 16-bit: 34*s*b*h bytes, plus 5*a*s^2*b when the attention stores its score matrix
    (stores_scores; SDPA/flash attention does not, FlashAttention section 3.1). With full
    activation checkpointing each layer keeps its 16-bit input, 2*s*b*h, plus one layer's full set
    while it is recomputed (section 4.2). fp32 (bytes_per_elem=4) scales the count by 4/2.
    """
    s, b, h, a = seq_len, micro_batch, hidden, n_heads
    per_layer = 34 * s * b * h + (5 * a * s * s * b if stores_scores else 0)
    kept = n_layers * 2 * s * b * h + per_layer if activation_checkpointing else n_layers * per_layer
    return kept * bytes_per_elem // 2


def measured_activation_bytes(
    coeffs: tuple[float, float, float, float],
    seq_len: int,
    micro_batch: int,
    n_layers: int,
    hidden: int,
    bytes_per_elem: int,
    activation_checkpointing: bool = False,
) -> int:
    """Activations from the model's own measurement (pipeline/train/describe.py: saved-tensor
    hooks on the meta device): b*(a*s + c*s^2) + d*s + k bytes. With full activation
    checkpointing each layer keeps its input (s*b*h elements) plus one layer's share of the
    measured set while it is recomputed (Korthikanti et al. 2022, section 4.2)."""
    a, c, d, k = coeffs
    s, b = seq_len, micro_batch
    full = math.ceil(b * (a * s + c * s * s) + d * s + k)
    if not activation_checkpointing:
        return full
    return n_layers * s * b * hidden * bytes_per_elem + math.ceil(full / max(1, n_layers))


def logits_bytes_per_device(seq_len: int, micro_batch: int, vocab_size: int) -> int:
    """fp32 logits for the loss, s*b*V*4, and their gradient of the same size in backward: at
    V=32k-128k this rivals a layer's activations. Not in Korthikanti's per-layer count."""
    return 2 * seq_len * micro_batch * vocab_size * 4


def headroom_frac(total_bytes: int, capacity_bytes: int) -> float:
    """(capacity - total) / capacity; negative when it does not fit."""
    if capacity_bytes <= 0:
        raise ValueError(f"capacity must be > 0 bytes, got {capacity_bytes}")
    return (capacity_bytes - total_bytes) / capacity_bytes


def fit_verdict(
    total_bytes: int,
    capacity_bytes: int,
    headroom_low: float = HEADROOM_TIGHT,
    headroom_high: float = HEADROOM_FITS,
) -> Verdict:
    """FITS when headroom >= high (30%), TIGHT when low (15%) <= headroom < high, else
    DOES_NOT_FIT (headroom < 15%, including over capacity)."""
    h = headroom_frac(total_bytes, capacity_bytes)
    if h >= headroom_high:
        return Verdict.FITS
    if h >= headroom_low:
        return Verdict.TIGHT
    return Verdict.DOES_NOT_FIT


def layer_tensor_sizes(shape: ModelShape) -> list[int]:
    """numel of every parameter tensor of the model (pipeline/train/model.py's layout)."""
    h, f, kv = shape.hidden, shape.ffn_hidden, shape.n_kv_heads * shape.head_dim
    if shape.arch == "llama":
        layer = [h * h, h * kv, h * kv, h * h, h * f, h * f, f * h, h, h]
        return [shape.vocab_size * h] + layer * shape.n_layers + [h, shape.vocab_size * h]
    layer = [h * h, h, h * h, h, h * h, h, h * h, h, h * f, f, f * h, h, h, h, h, h]
    return [shape.vocab_size * h, shape.seq_len * h] + layer * shape.n_layers + [h, h]


def largest_layer_params(shape: ModelShape) -> int:
    """The largest parameter tensor: what ZeRO-3 gathers whole at once (DeepSpeed's
    estimate_zero3_model_states_mem_needs 'largest_layer_params')."""
    return max(layer_tensor_sizes(shape))


def persistent_param_count(shape: ModelShape, threshold: int = PERSISTENCE_THRESHOLD) -> int:
    """Parameters in tensors under stage3_param_persistence_threshold: ZeRO-3 keeps them whole."""
    return sum(n for n in layer_tensor_sizes(shape) if n < threshold)


def lora_trainable_params(shape: ModelShape, rank: int) -> int:
    """LoRA (Hu et al. 2021, section 4.1) on every linear layer of every block: r*(in + out) per
    matrix (A: in x r, B: r x out)."""
    h, f, kv = shape.hidden, shape.ffn_hidden, shape.n_kv_heads * shape.head_dim
    if shape.arch == "llama":
        mats = [(h, h), (h, kv), (h, kv), (h, h), (h, f), (h, f), (f, h)]
    else:
        mats = [(h, h)] * 4 + [(h, f), (f, h)]
    return shape.n_layers * sum(rank * (i + o) for i, o in mats)


@dataclass(frozen=True)
class Term:
    """One line of the breakdown: bytes on the device and on the host (per rank), and why."""

    name: str
    device_bytes: int
    host_bytes: int
    source: str


@dataclass(frozen=True)
class MemoryQuery:
    """Everything the memory model needs for one sweep point."""

    params: int
    """The base model's parameters (LoRA's adapters are trainable_params, on top)."""
    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int
    seq_len: int
    micro_batch: int
    zero_stage: int
    dp_ranks: int
    capacity_bytes: int
    """Memory of one device (GPU), or on CPU the memory one rank may use."""
    precision: str = "bf16"
    offload_optimizer: bool = False
    offload_param: bool = False
    activation_checkpointing: bool = False
    on_gpu: bool = True
    """False for CPU runs: no CUDA context, and 'host' states share the same memory."""
    method: str = "full"
    trainable_params: int | None = None
    largest_layer: int = 0
    """Elements of the largest parameter tensor (gathered whole under ZeRO-3)."""
    persistent_params: int = 0
    embedding_params: int = 0
    """Kept in 16-bit by QLoRA (bitsandbytes quantizes the linear layers only)."""
    ranks_per_node: int = 1
    host_capacity_bytes: int | None = None
    """Memory of one node for the job (partition.mem_gb_per_node); None: not checked."""
    zero_init: bool = True
    """ZeRO-3 builds the model under deepspeed.zero.Init (never whole on one rank)."""
    loader_workers: int = 0
    stores_scores: bool = False
    activation_coeffs: tuple[float, float, float, float] | None = None
    """[a, c, d, k] of the activations the model measured it saves, in the training dtype (its
    description): b*(a*s + c*s^2) + d*s + k bytes; None: Korthikanti's formula."""
    quantized_params: int | None = None
    """QLoRA: the weights stored in 4-bit (None: every parameter but the adapters and
    embedding_params)."""

    @classmethod
    def from_shape(cls, shape: ModelShape, **rest: object) -> MemoryQuery:
        """Fill params and dimensions from a ModelShape; pass the rest as keywords."""
        dims: dict[str, object] = {
            "params": param_count(shape),
            "n_layers": shape.n_layers,
            "hidden": shape.hidden,
            "n_heads": shape.n_heads,
            "vocab_size": shape.vocab_size,
            "seq_len": shape.seq_len,
            "largest_layer": largest_layer_params(shape),
            "persistent_params": persistent_param_count(shape),
            "embedding_params": shape.vocab_size * shape.hidden * (2 if shape.arch == "llama" else 1),
        }
        return cls(**{**dims, **rest})  # type: ignore[arg-type]

    @classmethod
    def from_description(cls, d: ModelDescription, seq_len: int, **rest: object) -> MemoryQuery:
        """Fill params and dimensions from the model's own description (any family)."""
        sizes = d.tensor_sizes
        dtype = "fp32" if rest.get("precision") == "fp32" else "bf16"
        coeffs = d.activations.get(dtype) if d.activations else None
        dims: dict[str, object] = {
            "activation_coeffs": tuple(coeffs) if coeffs else None,
            "params": d.params,
            "n_layers": d.n_layers,
            "hidden": d.hidden,
            "n_heads": d.n_heads,
            "vocab_size": d.vocab_size,
            "seq_len": seq_len,
            "largest_layer": max(sizes),
            "persistent_params": sum(n for n in sizes if n < PERSISTENCE_THRESHOLD),
            "embedding_params": d.params - quantized_params(d),
            "quantized_params": quantized_params(d),
        }
        return cls(**{**dims, **rest})  # type: ignore[arg-type]


@dataclass(frozen=True)
class MemoryEstimate:
    model_states: ModelStates
    activations_bytes: int
    logits_bytes: int
    overhead_bytes: int
    total_bytes: int
    """Peak bytes on one device: the larger of the steady state and the initialisation peak."""
    capacity_bytes: int
    headroom_frac: float
    verdict: Verdict
    terms: tuple[Term, ...] = ()
    steady_bytes: int = 0
    init_bytes: int = 0
    host_bytes_per_node: int = 0
    host_capacity_bytes: int | None = None
    host_verdict: Verdict | None = None
    """None when the node's memory is not known; else as `verdict`, for the host."""
    reasons: tuple[str, ...] = field(default=())

    @property
    def overall(self) -> Verdict:
        """The worse of the device and host verdicts."""
        vs = [self.verdict] + ([self.host_verdict] if self.host_verdict else [])
        return max(vs, key=VERDICTS.index)


def model_params(q: MemoryQuery) -> int:
    """Parameters of the model as it trains: q.params is the base model's count, and LoRA adds
    its adapters as weights of their own (at the weights' precision, beside their gradients and
    optimizer state): issue #46, the term whose absence put LoRA's states 5-7% under measured."""
    return q.params + ((q.trainable_params or 0) if q.method != "full" else 0)


def _states(q: MemoryQuery) -> ModelStates:
    quant = None
    if q.method == "qlora" and q.quantized_params is not None:
        quant = q.quantized_params
    elif q.method == "qlora":
        quant = max(0, q.params - q.embedding_params)
    return model_states_bytes_per_device(
        model_params(q),
        q.zero_stage,
        q.dp_ranks,
        q.precision,
        q.offload_optimizer,
        q.offload_param,
        q.method,
        q.trainable_params,
        0,  # measured: at the step ZeRO-3 holds only partitions; persistent ones are gathered
        quantized_params=quant,
    )


def breakdown(q: MemoryQuery) -> list[Term]:
    """Every term of one rank's memory, on its device and on the host (see the module doc)."""
    w = weight_bytes(q.precision)
    st = _states(q)
    stage3 = "stage3.py" if q.zero_stage == 3 else "stage_1_and_2.py" if q.zero_stage else "bf16_optimizer.py"
    if q.activation_coeffs is not None:
        acts = measured_activation_bytes(
            q.activation_coeffs, q.seq_len, q.micro_batch, q.n_layers, q.hidden, w, q.activation_checkpointing
        )
        acts_source = "measured: saved-tensor hooks on the model (its description)"
    else:
        acts = activation_bytes_per_device(
            q.seq_len,
            q.micro_batch,
            q.hidden,
            q.n_heads,
            q.n_layers,
            w,
            q.activation_checkpointing,
            q.stores_scores,
        )
        acts_source = "Korthikanti et al. 2022 eq. 1 (SDPA: no score term)"
    terms = [
        Term("weights", st.params_bytes, 0, f"ZeRO sec. 3.1; deepspeed/runtime/zero/{stage3}"),
        Term("gradients", st.grads_bytes, 0, f"deepspeed/runtime/zero/{stage3} (fp32 cast of the partition)"),
        Term("optimizer", st.optimizer_bytes, 0, "ZeRO sec. 3.1: fp32 master + Adam m, v"),
        Term("offloaded states", 0, st.cpu_bytes, "ZeRO-Offload sec. 4; stage3.py pinned grad buffer"),
        Term("activations", acts, 0, acts_source),
        Term(
            "logits", logits_bytes_per_device(q.seq_len, q.micro_batch, q.vocab_size), 0, "fp32 logits + grad"
        ),
    ]
    if q.zero_stage == 3:
        gathered = w * (2 * q.largest_layer + PREFETCH_BUCKET_ELEMS)
        terms.append(
            Term("gathered layers", gathered, 0, "stage3.py prefetch (5e7) + largest layer, x2 in backward")
        )
    if q.zero_stage >= 1:  # allocated whole, however small the model (measured: 2e9 bytes fp32 on CPU)
        terms.append(
            Term("comm buckets", w * REDUCE_BUCKET_ELEMS, 0, "zero/config.py reduce_bucket_size 5e8")
        )
    rest = sum(t.device_bytes for t in terms)
    if q.on_gpu:
        terms.append(Term("CUDA context", CUDA_CONTEXT_BYTES, 0, "CUDA context + cuBLAS/NCCL workspaces"))
    terms.append(Term("allocator slack", int(ALLOCATOR_SLACK_FRAC * rest), 0, "caching allocator, 10%"))
    terms.append(Term("rank runtime", 0, RANK_RUNTIME_HOST_BYTES, "Python + torch + DeepSpeed per process"))
    return terms


def init_peak_bytes(q: MemoryQuery) -> tuple[int, int]:
    """(device, host) bytes of one rank while the engine is built. Without zero.Init (ZeRO-0/1/2,
    or ZeRO-3 with zero_init=False) each rank builds the whole model in fp32 on the host
    (4*Psi; DeepSpeed's estimators, zero_init=False), then moves it to the device in the training
    dtype before partitioning. Under zero.Init (ZeRO-3) each parameter is partitioned as it is
    created: the host holds one layer at a time, the device its partition."""
    w = weight_bytes(q.precision)
    if q.zero_stage == 3 and q.zero_init:
        return 0, 4 * q.largest_layer
    device = 0 if q.offload_param else w * model_params(q)
    return device, 4 * model_params(q)


def estimate(q: MemoryQuery) -> MemoryEstimate:
    """The per-device peak (max of steady state and initialisation), its headroom and verdict;
    and per node on the host: ranks x (host-held states + runtime + init) + loader workers."""
    terms = breakdown(q)
    st = _states(q)
    steady = sum(t.device_bytes for t in terms)
    host_rank = sum(t.host_bytes for t in terms)
    init_dev, init_host = init_peak_bytes(q)
    ctx = CUDA_CONTEXT_BYTES if q.on_gpu else 0
    init_dev = init_dev + ctx if init_dev else 0
    if not q.on_gpu:  # one memory: host-held states and the device are the same RAM
        steady += host_rank - RANK_RUNTIME_HOST_BYTES
        init_dev = init_host + init_dev
    total = max(steady, init_dev)
    host_node = q.ranks_per_node * (max(host_rank, RANK_RUNTIME_HOST_BYTES + init_host))
    host_node += q.loader_workers * q.ranks_per_node * LOADER_WORKER_HOST_BYTES
    if not q.on_gpu:
        host_node = q.ranks_per_node * (total + RANK_RUNTIME_HOST_BYTES)
    reasons = []
    if init_dev > steady:
        reasons.append(
            f"initialisation peak {init_dev / GIB:.1f} GiB > steady state {steady / GIB:.1f} GiB "
            "(the whole model is built on each rank before partitioning)"
        )
    host_verdict = None
    if q.host_capacity_bytes:
        host_verdict = fit_verdict(host_node, q.host_capacity_bytes)
    activations = next(t.device_bytes for t in terms if t.name == "activations")
    logits = next(t.device_bytes for t in terms if t.name == "logits")
    return MemoryEstimate(
        model_states=st,
        activations_bytes=activations,
        logits_bytes=logits,
        overhead_bytes=steady - st.device_bytes - activations - logits,
        total_bytes=total,
        capacity_bytes=q.capacity_bytes,
        headroom_frac=headroom_frac(total, q.capacity_bytes),
        verdict=fit_verdict(total, q.capacity_bytes),
        terms=tuple(terms),
        steady_bytes=steady,
        init_bytes=init_dev,
        host_bytes_per_node=host_node,
        host_capacity_bytes=q.host_capacity_bytes,
        host_verdict=host_verdict,
        reasons=tuple(reasons),
    )


def largest_micro_batch(q: MemoryQuery, headroom: float, cap: int = 4096) -> int:
    """The largest micro-batch (<= cap) whose device peak leaves at least `headroom` of the
    capacity free; 0 when not even 1 does. Memory grows with the micro-batch, so bisect."""

    def ok(b: int) -> bool:
        return headroom_frac(estimate(replace(q, micro_batch=b)).total_bytes, q.capacity_bytes) >= headroom

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, cap + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def _describe(e: MemoryEstimate) -> str:
    return f"{e.overall}, {e.total_bytes / GIB:.1f} GiB, headroom {e.headroom_frac:.0%}"


def _adapter(q: MemoryQuery) -> MemoryQuery:
    return replace(q, method="lora", trainable_params=int(LORA_TRAINABLE_FRAC * q.params))


def advice(
    q: MemoryQuery, larger_devices: Sequence[tuple[str, int]] = (), now: MemoryEstimate | None = None
) -> list[str]:
    """What would make a point that is not 'fits' fit better; only changes that improve the
    verdict (the worse of device and host), computed from the same model.

    Tried in this order, each alone: activation checkpointing, the lowest higher ZeRO stage that
    helps, optimizer offload (ZeRO >= 1), optimizer + parameter offload (ZeRO-3), an adapter
    (LoRA, LORA_TRAINABLE_FRAC trainable) when the run is a full fine-tune, and the smallest
    larger device from larger_devices ((name, capacity_bytes) pairs) that fits, else the smallest
    that improves the verdict. Each string ends with the verdict it would reach. `now`: q's own
    estimate when the caller has it (else computed here).
    """
    now = now or estimate(q)
    rank = VERDICTS.index
    if now.overall == Verdict.FITS:
        return []
    out: list[str] = []

    def consider(text: str, alt: MemoryEstimate) -> None:
        if rank(alt.overall) < rank(now.overall):
            out.append(f"{text}: {_describe(alt)}")

    if not q.activation_checkpointing:
        consider("enable activation checkpointing", estimate(replace(q, activation_checkpointing=True)))
    for stage in range(q.zero_stage + 1, 4):
        alt = estimate(replace(q, zero_stage=stage))
        if rank(alt.overall) < rank(now.overall):
            consider(f"use ZeRO-{stage}", alt)
            break
    if not q.offload_optimizer:
        stage = max(q.zero_stage, 1)
        where = "" if stage == q.zero_stage else f" (needs ZeRO-{stage})"
        alt = estimate(replace(q, zero_stage=stage, offload_optimizer=True))
        consider(f"offload the optimizer state to CPU{where}", alt)
    if not q.offload_param:
        where = "" if q.zero_stage == 3 else " (needs ZeRO-3)"
        alt = estimate(replace(q, zero_stage=3, offload_optimizer=True, offload_param=True))
        consider(f"offload optimizer state and parameters to CPU{where}", alt)
    if q.method == "full":
        consider("fine-tune an adapter (LoRA) instead of all weights", estimate(_adapter(q)))
    bigger = [estimate(replace(q, capacity_bytes=c)) for _, c in larger_devices]
    tiers = sorted(
        (e for e in bigger if e.capacity_bytes > q.capacity_bytes),
        key=lambda e: (rank(e.overall), e.capacity_bytes),
    )
    names = {c: n for n, c in larger_devices}
    if tiers:
        best = tiers[0]
        consider(f"move to {names[best.capacity_bytes]} ({best.capacity_bytes / GIB:.0f} GiB)", best)
    return out
