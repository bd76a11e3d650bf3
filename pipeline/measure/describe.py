"""Parameters, adapters and training FLOPs of any causal LM, read from its description (the
JSON pipeline/train/describe.py writes from the model transformers builds on the meta device).

Pure functions: the description in, plain numbers out. Conventions as pipeline/measure/flops.py
(PaLM appendix B; torchtitan, nanoGPT): every matmul with a weight counts 2 FLOPs per weight per
token forward, the output layer included (tied or not) and the embedding lookup not; attention
counts QK^T and AV over the full T x T square, 2*T*H*(Dqk + Dv) per token per call forward and
twice that backward. Routed experts (3-D expert weights) run top_k of their E experts per token.

Per method (the frozen-base rules, exact):
- full: forward 2W, backward 4W (input and weight gradients), attention 3x its forward;
- lora, qlora: forward 2W; backward only the input gradients of the matmuls whose input needs
  one (in the first block the layers that read the frozen embedding's output get none; the
  description's probe says which); attention backward where q, k or v needs a gradient; each
  adapter (A: in x r, B: r x out) 6r(in + out), less A's input gradient 2r*in where its input
  needs none. QLoRA's 4-bit base is counted as its compute dtype (the dequantisation is not a
  matmul). Checked in tests/unit/test_describe.py against torch's FlopCounterMode for every family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.measure.kinds import METHODS

DESCRIPTION_FORMAT = 3
"""The layout of the description's JSON; a change makes every cached description stale."""
MATMUL_KINDS = ("linear", "expert", "router")


@dataclass(frozen=True)
class Linear:
    name: str
    in_features: int
    out_features: int
    bias: bool


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter of the peft model as built, at rank 1 (pipeline/train/describe.py)."""

    name: str
    """The module it adapts, or for a 3-D expert weight its container's name + "." + the weight."""
    in_features: int
    out_features: int
    ranks: int
    """lora_A's rows at r=1: 1; the projections fused into one weight (peft doubles the rank of
    a fused gate_up); times the experts for a 3-D expert weight."""
    experts: int = 0
    """E for an adapter on a 3-D expert weight (peft's ParamWrapper), else 0."""

    @property
    def owner(self) -> str:
        """The module whose matmul it adds to."""
        return self.name.rpartition(".")[0] if self.experts else self.name


@dataclass(frozen=True)
class ModelDescription:
    """What the built model is (pipeline/train/describe.py documents each field)."""

    family: str
    params: int
    tie_embeddings: bool
    vocab_size: int
    hidden: int
    n_layers: int
    head: str
    tensors: tuple[tuple[str, int, str, tuple[int, ...]], ...]
    linears: tuple[Linear, ...]
    targets: tuple[str, ...]
    """What the adapters adapt (Adapter.name), as peft built them."""
    input_grad: dict[str, bool]
    """Per matmul owner (module name): whether its input needs a gradient when only the
    adapters on `targets` train."""
    attention: tuple[tuple[int, int, int, bool], ...]
    """Per attention call of a forward: heads, q/k head size, v head size, backward runs (LoRA)."""
    adapters: tuple[Adapter, ...] = ()
    """The LoRA adapters of the peft model built on the meta device from the requested targets."""
    requested: tuple[str, ...] | None = None
    """The LoRA target names the adapters were built from (None: the job's all-linear)."""
    routers: tuple[str, ...] = ()
    """MoE routers that are linear modules: never adapted nor quantized."""
    top_k: int | None = None
    activations: dict[str, list[float]] | None = None
    """Per dtype (fp32, bf16): [a, c, d, k] of the bytes a full fine-tune saves for backward,
    b*(a*s + c*s^2) + d*s + k (measured on the meta device; None for routed experts)."""
    folder: str | None = None
    config_sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ModelDescription:
        return cls(
            family=d["family"],
            params=int(d["params"]),
            tie_embeddings=bool(d["tie_embeddings"]),
            vocab_size=int(d["vocab_size"]),
            hidden=int(d["hidden"]),
            n_layers=int(d["n_layers"]),
            head=d["head"],
            tensors=tuple((n, int(k), kind, tuple(shape)) for n, k, kind, shape in d["tensors"]),
            linears=tuple(Linear(n, int(i), int(o), bool(b)) for n, i, o, b in d["linears"]),
            targets=tuple(d["targets"]),
            input_grad={k: bool(v) for k, v in d["input_grad"].items()},
            attention=tuple((int(h), int(q), int(v), bool(g)) for h, q, v, g in d["attention"]),
            adapters=tuple(Adapter(n, int(i), int(o), int(a), int(e)) for n, i, o, a, e in d["adapters"]),
            requested=tuple(d["requested"]) if d.get("requested") else None,
            routers=tuple(d.get("routers") or ()),
            top_k=d.get("top_k"),
            activations=d.get("activations"),
            folder=d.get("folder"),
            config_sha256=d.get("config_sha256"),
        )

    @property
    def n_heads(self) -> int:
        return self.attention[0][0] if self.attention else 0

    @property
    def head_dim(self) -> int:
        return self.attention[0][1] if self.attention else 0

    @property
    def embedding_params(self) -> int:
        """Token (and position) embeddings: the nn.Embedding tensors."""
        return sum(n for _, n, kind, _ in self.tensors if kind == "embedding")

    @property
    def head_params(self) -> int:
        """The output layer's weight when it is its own tensor (0 when tied to the embedding)."""
        return (
            0
            if self.tie_embeddings
            else sum(n for name, n, _, _ in self.tensors if name == self.head + ".weight")
        )

    @property
    def tensor_sizes(self) -> list[int]:
        """numel of every parameter tensor (a tied one once)."""
        return [n for _, n, _, _ in self.tensors]


def linear_names(d: ModelDescription) -> list[str]:
    """The names peft matches a target against: each linear module's last dotted part."""
    return sorted({lin.name.rsplit(".", 1)[-1] for lin in d.linears})


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def unmatched_targets(d: ModelDescription, targets: Sequence[str]) -> list[str]:
    """The given LoRA targets that match no linear module (peft's rule: the module's name or its
    last dotted parts)."""
    return [str(t) for t in targets if not any(_matches(lin.name, str(t)) for lin in d.linears)]


def outside_blocks(d: ModelDescription, targets: Sequence[str]) -> list[str]:
    """The given LoRA targets that name the output layer or an embedding (outside the
    transformer blocks, which this project's LoRA adapts), as the model itself names them."""
    outside = [d.head] + [
        name.removesuffix(".weight") for name, _, kind, _ in d.tensors if kind == "embedding"
    ]
    return [str(t) for t in targets if any(_matches(name, str(t)) for name in outside)]


def routers_named(d: ModelDescription, targets: Sequence[str]) -> list[str]:
    """The given LoRA targets that name an MoE router (a linear module that picks the experts)."""
    return [str(t) for t in targets if any(_matches(name, str(t)) for name in d.routers)]


def _check_targets(d: ModelDescription, targets: Sequence[str]) -> None:
    if (tuple(sorted(map(str, targets))) or None) != d.requested:
        raise ValueError("the description's adapters were built for other LoRA targets")


def adapter_params(d: ModelDescription, rank: int, targets: Sequence[str] = ()) -> int:
    """LoRA's trainable parameters (Hu et al. 2021) as peft builds them: r*(in + out) per
    adapter and per fused projection or expert (Adapter.ranks)."""
    _check_targets(d, targets)
    return rank * sum(a.ranks * (a.in_features + a.out_features) for a in d.adapters)


def quantized_params(d: ModelDescription) -> int:
    """Weights QLoRA stores in 4-bit: every linear layer's weight but the output head's and the
    routers' (pipeline/train/model.py quantizes nn.Linear and Conv1D; biases, norms, embeddings,
    routers and 3-D expert weights stay in 16-bit)."""
    keep = {d.head, *d.routers}
    return sum(lin.in_features * lin.out_features for lin in d.linears if lin.name not in keep)


def non_embedding_params(d: ModelDescription) -> int:
    """Kaplan et al. 2020's N: all parameters but the embeddings and an untied output layer."""
    return d.params - d.embedding_params - d.head_params


def _owner_weights(d: ModelDescription) -> dict[str, float]:
    """Matmul weights a token goes through, per owning module: a linear layer's in*out, a
    router's weight, an expert tensor's top_k/E share."""
    out: dict[str, float] = {lin.name: lin.in_features * lin.out_features for lin in d.linears}
    for name, n, kind, shape in d.tensors:
        owner = name.rpartition(".")[0]
        if kind == "router":
            out[owner] = out.get(owner, 0) + n
        elif kind == "expert":
            share = (d.top_k or shape[0]) / shape[0]
            out[owner] = out.get(owner, 0) + n * share
    return out


def forward_weights(d: ModelDescription) -> float:
    """W: the matmul weights one token goes through (active experts only), output layer included."""
    return sum(_owner_weights(d).values())


def attention_forward_flops(d: ModelDescription, seq_len: int) -> int:
    """Forward FLOPs per token of every attention call: 2*T*H*(Dqk + Dv)."""
    return sum(2 * seq_len * h * (q + v) for h, q, v, _ in d.attention)


def training_flops_per_token(
    d: ModelDescription,
    seq_len: int,
    method: str = "full",
    rank: int = 0,
    targets: Sequence[str] = (),
    micro_batch: int = 1,
) -> float:
    """Model FLOPs per trained token, forward + backward, of a fine-tuning method (module doc),
    at `micro_batch` sequences of `seq_len` per step of a rank. For lora/qlora the description
    must have been made for the same targets."""
    if method not in METHODS:
        raise ValueError(f"unknown fine-tuning method {method!r}; expected one of {METHODS}")
    w, attn = forward_weights(d), attention_forward_flops(d, seq_len)
    if method == "full":
        return 6 * w + 3 * attn
    _check_targets(d, targets)
    input_grads = sum(2 * n for owner, n in _owner_weights(d).items() if d.input_grad.get(owner, True))
    attn_bwd = sum(4 * seq_len * h * (q + v) for h, q, v, grad in d.attention if grad)
    return 2 * w + attn + input_grads + attn_bwd + adapter_flops_per_token(d, rank, seq_len * micro_batch)


def adapter_flops_per_token(d: ModelDescription, rank: int, tokens: int) -> float:
    """The adapters' FLOPs per trained token, forward + backward, at `tokens` per micro-batch.
    A module's adapter (x A B): 6r(in + out) per token, less A's input gradient 2r*in where its
    input needs none. An adapter on a 3-D expert weight (peft's ParamWrapper) adds B_e A_e to
    each expert's weight in each forward with one baddbmm, 2rE*in*out, and once more when it
    registers that parametrization (torch's register_parametrization evaluates it to check its
    shape), and twice that backward: 8rE*in*out a micro-batch, amortised over its tokens; that
    weight then needs its gradient: 2*in*out per token for each of the top_k experts it runs."""
    total = 0.0
    for a in d.adapters:
        r = rank * a.ranks
        if not a.experts:
            total += 6 * r * (a.in_features + a.out_features)
            total -= 0 if d.input_grad.get(a.owner, True) else 2 * r * a.in_features
            continue
        per_expert = a.in_features * a.out_features
        total += 8 * r * per_expert / tokens + 2 * (d.top_k or a.experts) * per_expert
    return total
