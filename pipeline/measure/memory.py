"""Per-device memory model of a DeepSpeed ZeRO fine-tune: model states, activations, verdict.

Pure functions, bytes everywhere (GiB = 2**30 only in messages). Sources: ZeRO (Rajbhandari
et al. 2020, section 3.1 and figure 1) for model states; Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4.1 and 4.2) for activations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipeline.measure.flops import ModelShape, param_count

PRECISIONS = ("bf16", "fp16", "fp32")
VERDICTS = ("fits", "tight", "does_not_fit")  # best first

GIB = 2**30
CUDA_CONTEXT_BYTES = GIB
"""Fixed per-GPU cost outside the caching allocator: CUDA context, cuBLAS/NCCL workspaces.
Typically 0.5-1 GiB on A100/H100 with NCCL; we take the upper end. Zero on CPU."""
FRAGMENTATION_FRAC = 0.10
"""Allocator fragmentation and temporary buffers (ZeRO buckets, all-gather prefetch) as a fraction
of model states + activations + logits, on GPU and CPU alike."""
LORA_TRAINABLE_FRAC = 0.01
"""Trainable share of an adapter fine-tune: rank-16 LoRA on every linear layer of Llama-2-7B is
40M of 6.7B (0.6%); 1% is the conservative round number."""


@dataclass(frozen=True)
class ModelStates:
    """Model-state bytes of one data-parallel rank: on its device, and offloaded to host RAM."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    cpu_bytes: int

    @property
    def device_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _bytes_per_param(precision: str) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes per parameter for Adam.

    Mixed precision (bf16, fp16): 2 + 2 + 12 (fp32 master, m, v), ZeRO paper section 3.1.
    fp32: 4 + 4 + 8 (m, v), the convention here. DeepSpeed's ZeRO-1/2 optimizer keeps a cloned
    fp32 partition even in fp32 training, 4*Psi/Nd more than this count.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
    return (4, 4, 8) if precision == "fp32" else (2, 2, 12)


def model_states_bytes_per_device(
    params: int,
    zero_stage: int,
    dp_ranks: int,
    precision: str = "bf16",
    offload_optimizer: bool = False,
    offload_param: bool = False,
) -> ModelStates:
    """Model states of one rank (ZeRO paper, figure 1; Psi = params, Nd = dp_ranks).

    Mixed precision: ZeRO-0 16Psi, ZeRO-1 4Psi + 12Psi/Nd, ZeRO-2 2Psi + 14Psi/Nd, ZeRO-3 16Psi/Nd.
    fp32 (4 + 4 + 8) is partitioned the same way: stage >= 1 shards the optimizer state, >= 2 the
    gradients, 3 the weights. Partitions are rounded up, as DeepSpeed pads them to equal size.
    offload_optimizer (stage 1-3, DeepSpeed ZeRO-Offload) moves the optimizer partition to host
    RAM; offload_param (stage 3 only, ZeRO-Infinity) moves the weight partition too. Gradient
    partitions are kept on the device: DeepSpeed streams them to the host through reduce
    buckets of about that size, so this stays an upper bound.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0-3, got {zero_stage}")
    if dp_ranks < 1 or params < 0:
        raise ValueError(f"need dp_ranks >= 1 and params >= 0, got {dp_ranks}, {params}")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3")
    if offload_param and zero_stage != 3:
        raise ValueError("offload_param needs ZeRO stage 3")
    w, g, o = _bytes_per_param(precision)
    opt = _ceil_div(o * params, dp_ranks) if zero_stage >= 1 else o * params
    grads = _ceil_div(g * params, dp_ranks) if zero_stage >= 2 else g * params
    weights = _ceil_div(w * params, dp_ranks) if zero_stage == 3 else w * params
    cpu = (opt if offload_optimizer else 0) + (weights if offload_param else 0)
    return ModelStates(
        params_bytes=0 if offload_param else weights,
        grads_bytes=grads,
        optimizer_bytes=0 if offload_optimizer else opt,
        cpu_bytes=cpu,
    )


def activation_bytes_per_device(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    n_heads: int,
    n_layers: int,
    bytes_per_elem: int = 2,
    activation_checkpointing: bool = False,
) -> int:
    """Activations kept for backward (Korthikanti et al. 2022, equation 1, no tensor parallelism).

    Per layer, 16-bit: s*b*h*(34 + 5*a*s/h) bytes (the 5as/h part is the attention score matrix,
    which a flash/SDPA kernel does not store: the formula is an upper bound there). With full
    activation checkpointing only each layer's 16-bit input is kept, 2*s*b*h per layer, plus one
    layer's full set while it is recomputed (section 4.2). fp32 activations (bytes_per_elem=4)
    scale the whole count by bytes_per_elem / 2.
    """
    s, b, h, a = seq_len, micro_batch, hidden, n_heads
    per_layer = 34 * s * b * h + 5 * a * s * s * b  # s*b*h*(34 + 5as/h), kept integral
    kept = n_layers * 2 * s * b * h + per_layer if activation_checkpointing else n_layers * per_layer
    return kept * bytes_per_elem // 2


def logits_bytes_per_device(seq_len: int, micro_batch: int, vocab_size: int) -> int:
    """fp32 logits for the loss, s*b*V*4: Hugging Face causal LMs upcast the logits before the
    cross-entropy, and at V=32k-128k this buffer rivals a layer's activations. Not in Korthikanti's
    per-layer count, so it is a separate term."""
    return seq_len * micro_batch * vocab_size * 4


def headroom_frac(total_bytes: int, capacity_bytes: int) -> float:
    """(capacity - total) / capacity; negative when it does not fit. Integer numerator, so an
    exact 30% or 15% compares equal to the thresholds 0.30 and 0.15."""
    if capacity_bytes <= 0:
        raise ValueError(f"capacity must be > 0 bytes, got {capacity_bytes}")
    return (capacity_bytes - total_bytes) / capacity_bytes


def fit_verdict(
    total_bytes: int, capacity_bytes: int, headroom_low: float = 0.15, headroom_high: float = 0.30
) -> str:
    """'fits' when headroom >= high (30%), 'tight' when low (15%) <= headroom < high, else
    'does_not_fit' (headroom < 15%, including over capacity). docs/design.md asks for 15-30% headroom:
    below 15% a run may start but the estimate's error and allocator spikes make an OOM likely."""
    h = headroom_frac(total_bytes, capacity_bytes)
    if h >= headroom_high:
        return "fits"
    if h >= headroom_low:
        return "tight"
    return "does_not_fit"


@dataclass(frozen=True)
class MemoryQuery:
    """Everything the memory model needs for one sweep point, per device."""

    params: int
    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int
    seq_len: int
    micro_batch: int
    zero_stage: int
    dp_ranks: int
    capacity_bytes: int
    precision: str = "bf16"
    offload_optimizer: bool = False
    offload_param: bool = False
    activation_checkpointing: bool = False
    on_gpu: bool = True
    """False for CPU runs: no CUDA context, and offloaded states share the same memory."""

    @classmethod
    def from_shape(cls, shape: ModelShape, **rest: object) -> MemoryQuery:
        """Fill params and dimensions from a ModelShape; pass the rest as keywords."""
        dims = {
            "params": param_count(shape),
            "n_layers": shape.n_layers,
            "hidden": shape.hidden,
            "n_heads": shape.n_heads,
            "vocab_size": shape.vocab_size,
            "seq_len": shape.seq_len,
        }
        return cls(**dims, **rest)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MemoryEstimate:
    model_states: ModelStates
    activations_bytes: int
    logits_bytes: int
    overhead_bytes: int
    total_bytes: int
    """Bytes on the device: model states there + activations + logits + overhead."""
    capacity_bytes: int
    headroom_frac: float
    verdict: str


def _assemble(q: MemoryQuery, states: ModelStates) -> MemoryEstimate:
    elem = 4 if q.precision == "fp32" else 2
    acts = activation_bytes_per_device(
        q.seq_len, q.micro_batch, q.hidden, q.n_heads, q.n_layers, elem, q.activation_checkpointing
    )
    logits = logits_bytes_per_device(q.seq_len, q.micro_batch, q.vocab_size)
    resident = states.device_bytes + (0 if q.on_gpu else states.cpu_bytes) + acts + logits
    overhead = (CUDA_CONTEXT_BYTES if q.on_gpu else 0) + int(FRAGMENTATION_FRAC * resident)
    total = resident + overhead
    return MemoryEstimate(
        model_states=states,
        activations_bytes=acts,
        logits_bytes=logits,
        overhead_bytes=overhead,
        total_bytes=total,
        capacity_bytes=q.capacity_bytes,
        headroom_frac=headroom_frac(total, q.capacity_bytes),
        verdict=fit_verdict(total, q.capacity_bytes),
    )


def estimate(q: MemoryQuery) -> MemoryEstimate:
    """Per-device estimate: model states + activations + fp32 logits + overhead
    (CUDA_CONTEXT_BYTES on GPU + FRAGMENTATION_FRAC of the rest), with headroom and verdict."""
    states = model_states_bytes_per_device(
        q.params, q.zero_stage, q.dp_ranks, q.precision, q.offload_optimizer, q.offload_param
    )
    return _assemble(q, states)


def _adapter_estimate(q: MemoryQuery) -> MemoryEstimate:
    """LoRA-style fine-tune: frozen weights (sharded at ZeRO-3) + full Adam states for the
    LORA_TRAINABLE_FRAC adapter parameters, unsharded; activations unchanged."""
    w, g, o = _bytes_per_param(q.precision)
    frozen = _ceil_div(w * q.params, q.dp_ranks) if q.zero_stage == 3 else w * q.params
    trainable = int(LORA_TRAINABLE_FRAC * q.params)
    states = ModelStates(frozen + w * trainable, g * trainable, o * trainable, 0)
    return _assemble(q, states)


def _describe(e: MemoryEstimate) -> str:
    return f"{e.verdict}, {e.total_bytes / GIB:.1f} GiB, headroom {e.headroom_frac:.0%}"


def advice(q: MemoryQuery, larger_devices: Sequence[tuple[str, int]] = ()) -> list[str]:
    """What would make a point that is not 'fits' fit better; only changes that improve the verdict.

    Tried in this order, each alone: activation checkpointing, the lowest higher ZeRO stage that
    helps, optimizer offload (ZeRO >= 1), optimizer + parameter offload (ZeRO-3), an adapter
    method (LoRA, LORA_TRAINABLE_FRAC trainable), and a larger device from larger_devices
    ((name, capacity_bytes) pairs, e.g. the next GPU tiers): the smallest that fits, else the
    smallest that improves the verdict. Each string ends with the verdict it would reach.
    """
    now = estimate(q)
    rank = VERDICTS.index
    if now.verdict == "fits":
        return []
    out: list[str] = []

    def consider(text: str, alt: MemoryEstimate) -> None:
        if rank(alt.verdict) < rank(now.verdict):
            out.append(f"{text}: {_describe(alt)}")

    if not q.activation_checkpointing:
        consider("enable activation checkpointing", estimate(replace(q, activation_checkpointing=True)))
    for stage in range(q.zero_stage + 1, 4):
        alt = estimate(replace(q, zero_stage=stage))
        if rank(alt.verdict) < rank(now.verdict):
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
    consider("fine-tune an adapter (LoRA) instead of all weights", _adapter_estimate(q))
    bigger = [estimate(replace(q, capacity_bytes=c)) for _, c in larger_devices]
    tiers = sorted(
        (e for e in bigger if e.capacity_bytes > q.capacity_bytes),
        key=lambda e: (rank(e.verdict), e.capacity_bytes),
    )
    names = {c: n for n, c in larger_devices}
    if tiers:  # the smallest device that fits, else the smallest that fits better
        best = tiers[0]
        consider(f"move to {names[best.capacity_bytes]} ({best.capacity_bytes / GIB:.0f} GiB)", best)
    return out
