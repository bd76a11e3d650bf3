"""The model describes itself: transformers builds it from its config on the meta device (no
memory, no weights read, any size, well under a second) and this module records what the
memory model, the FLOPs, the adapters and the record need, as plain JSON
(pipeline/measure/describe.py reads it; docs/models.md).

Recorded: every parameter tensor with its kind (embedding, linear, expert, router, norm, bias),
every linear module (nn.Linear and GPT-2's Conv1D) with its in and out features, which one is
the output head, the routed experts (3-D expert weights, top-k of E per token), and, from one
forward pass on the meta device, every attention call (heads, head sizes) and, for the LoRA
targets asked for, which matmuls get an input gradient when only the adapters train (in the
first block, the layers that read the frozen embedding's output do not).

Run as `python -m pipeline.train.describe` it reads one request (JSON on stdin: the model
section and the LoRA targets) and prints the description: the login node runs it in a helper
process (pipeline/config/pretrained.py), so `qualify` itself never imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from pipeline.config.pretrained import describe_in_process
from pipeline.config.schema import ModelConfig
from pipeline.measure.describe import DESCRIPTION_FORMAT

_PROBE_TOKENS = 7  # odd: an eager attention's T x T matmuls are told from head-size ones
_ACT_TOKENS = 64
_NORM = re.compile(r"norm|ln_|layernorm", re.IGNORECASE)


def _linear_classes() -> tuple[type, ...]:
    from transformers.pytorch_utils import Conv1D

    return (nn.Linear, Conv1D)


def _in_out(module: nn.Module) -> tuple[int, int]:
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight: Any = module.weight
    return int(weight.shape[0]), int(weight.shape[1])  # Conv1D: (in, out)


def _kind(owner: nn.Module, pname: str, p: torch.Tensor, linear_types: tuple[type, ...]) -> str:
    if isinstance(owner, nn.Embedding):
        return "embedding"
    if p.dim() == 1:
        return "bias" if pname.endswith("bias") and not _NORM.search(type(owner).__name__) else "norm"
    if isinstance(owner, linear_types):
        return "linear"
    if p.dim() == 3:
        return "expert"
    return "router"


def _top_k(hf: Any) -> int | None:
    for key in ("num_experts_per_tok", "moe_topk", "top_k"):
        value = getattr(hf, key, None)
        if isinstance(value, int):
            return value
    return None


class _AttentionCalls(TorchFunctionMode):
    """Records each scaled_dot_product_attention call: heads, q/k and v head sizes, and whether
    its backward runs (any of q, k, v needs a gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int, int, bool]] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k, v = args[:3]
            grad = any(t.requires_grad for t in (q, k, v))
            self.calls.append((int(q.shape[-3]), int(q.shape[-1]), int(v.shape[-1]), grad))
        elif func is torch.matmul and _is_scores(*args[:2]):  # eager attention: Q K^T
            q, k = args[:2]
            grad = q.requires_grad or k.requires_grad
            self.calls.append((int(q.shape[-3]), int(q.shape[-1]), int(q.shape[-1]), grad))
        return func(*args, **kwargs)


def _is_scores(a: Any, b: Any) -> bool:
    """A (B, H, T, D) @ (B, H, D, T) matmul: the scores of an eager attention."""
    dims = getattr(a, "ndim", 0) == 4 and getattr(b, "ndim", 0) == 4
    return dims and a.shape[-2] == b.shape[-1] == _PROBE_TOKENS and a.shape[-1] != _PROBE_TOKENS


def _probe(model: nn.Module, hf: Any, owners: dict[str, nn.Module]) -> dict[str, Any]:
    """One forward on the meta device of the model as it trains (the peft model as built, only
    its adapters trainable; the base model for a full fine-tune): which matmul owners get an
    input that needs a gradient, and each attention call. Pre-hooks only: a module's output
    (a router's tuple, a cache) is never touched."""
    from transformers import DynamicCache

    needs: dict[str, bool] = {}
    handles = []
    for name, mod in owners.items():

        def pre(_m: nn.Module, args: Any, kwargs: Any, name: str = name) -> None:
            x = args[0] if args else next(iter(kwargs.values()), None)
            needs[name] = bool(getattr(x, "requires_grad", False))

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
    calls = _AttentionCalls()
    ids = torch.zeros(1, _PROBE_TOKENS, dtype=torch.long, device="meta")
    try:
        with calls:  # an (empty) cache skips the packed-sequence check, which reads a meta value
            model(input_ids=ids, past_key_values=DynamicCache(config=hf), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return {"input_grad": needs, "attention": [list(c) for c in calls.calls]}


def _adapters(peft_model: nn.Module, base_names: dict[int, str]) -> list[list[Any]]:
    """Every LoRA adapter of the peft model as built, at rank 1: [what it adapts (a module's
    name, or an expert container's name + "." + its 3-D parameter), in, out, ranks (lora_A's rows
    at r=1: 1, the number of fused projections, or experts x that for a 3-D weight), experts
    (0 for a module's adapter, E for peft's ParamWrapper on routed experts)]."""
    out = []
    mod: Any
    for mod in peft_model.modules():
        lora_a = getattr(mod, "lora_A", None)
        if not isinstance(lora_a, nn.ModuleDict) or "default" not in lora_a:
            continue
        a: Any = lora_a["default"].weight
        b: Any = mod.lora_B["default"].weight
        base = mod.get_base_layer()
        name = base_names[id(base)]
        experts = int(getattr(mod, "num_experts", 0) or 0)
        param = getattr(mod, "parameter_name", None)
        if param:
            name = f"{name}.{param}"
        a_shape, b_shape = tuple(a.shape), tuple(b.shape)
        out.append([name, int(a_shape[1]), int(b_shape[0]), int(a_shape[0]), experts])
    return sorted(out)


class _SavedBytes(TorchFunctionMode):
    """Bytes of the distinct storages autograd saves for backward in one forward on the meta
    device, parameters excluded (saved-tensor hooks). Meta has no attention kernel of its own:
    scaled_dot_product_attention's own saved tensors are replaced by what the fused kernels
    (CPU flash, CUDA flash and memory-efficient) save, q, k, v, the output and the per-row
    log-sum-exp in fp32, and its output takes q's memory layout as theirs does."""

    def __init__(self, params: set[int]) -> None:
        super().__init__()
        self.params, self.seen, self.keep, self.inside = params, {}, [], False  # type: ignore[var-annotated]

    def add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st._cdata not in self.params and st._cdata not in self.seen:
            self.seen[st._cdata] = st.nbytes()
            self.keep.append(t)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if not self.inside:
            self.add(t)
        return t

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
        if func is not torch.nn.functional.scaled_dot_product_attention or mask is not None:
            return func(*args, **kwargs)
        self.inside = True
        try:
            out = func(*args, **kwargs)
        finally:
            self.inside = False
        q, k, v = args[:3]
        if q.shape == out.shape:
            out = out.new_empty_strided(out.shape, torch.empty_like(q).stride()).requires_grad_(
                out.requires_grad
            )
        if out.requires_grad:
            for t in (q, k, v, out):
                self.add(t)
            self.seen[("lse", len(self.seen))] = q.shape[0] * q.shape[1] * q.shape[2] * 4
        return out


def _saved_bytes(model: nn.Module, batch: int, tokens: int) -> int:
    from unittest import mock

    probe = _SavedBytes({p.untyped_storage()._cdata for p in model.parameters()})
    ids = torch.zeros(batch, tokens, dtype=torch.long, device="meta")
    # the packed-sequence check reads a meta value; a cache would copy k and v
    with (
        mock.patch("transformers.masking_utils.find_packed_sequence_indices", lambda *a, **k: None),
        probe,
        torch.autograd.graph.saved_tensors_hooks(probe.pack, lambda t: t),
    ):
        model(input_ids=ids, use_cache=False)
    return sum(probe.seen.values())


def _activations(model: nn.Module) -> dict[str, list[float]]:
    """Activations a full fine-tune saves for backward, per dtype, as [a, c, d, k]: bytes
    b*(a*s + c*s^2) + d*s + k at micro-batch b and sequence length s (d: what the batch shares,
    the rotary cos/sin), solved from four meta forwards at b in (1, 2) and s in (S, 2S). The
    logits' fp32 copy and the loss are not in it (the memory model's logits term)."""
    out = {}
    s1, s2 = _ACT_TOKENS, 2 * _ACT_TOKENS
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model.to(dtype)
        f = {(b, s): _saved_bytes(model, b, s) for b in (1, 2) for s in (s1, s2)}
        p1, p2 = f[2, s1] - f[1, s1], f[2, s2] - f[1, s2]  # one sample: a*s + c*s^2
        c = (p2 / s2 - p1 / s1) / (s2 - s1)
        a = p1 / s1 - c * s1
        sh1, sh2 = f[1, s1] - p1, f[1, s2] - p2  # shared by the batch: d*s + k
        d = (sh2 - sh1) / (s2 - s1)
        out[name] = [a, c, d, sh1 - d * s1]
    model.to(torch.float32)
    return out


@contextlib.contextmanager
def meta_autocast() -> Iterator[None]:
    """torch.autocast(device_type="meta") raises (meta has no autocast), and peft's adapter on a
    3-D expert weight opens one (disabled) around its delta weight: on meta it is a no-op."""
    from unittest import mock

    real = torch.autocast

    def autocast(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return contextlib.nullcontext() if device_type == "meta" else real(device_type, *args, **kwargs)

    with mock.patch("torch.autocast", autocast):
        yield


class DescribeError(ValueError):
    """A step of the description failed; the message names the step and the library's error."""


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    try:
        yield
    except DescribeError:
        raise
    except Exception as e:  # noqa: BLE001 (the step's library failed: named, with its first line)
        first = str(e).strip().splitlines()
        raise DescribeError(f"{what} failed ({type(e).__name__}: {first[0][:300] if first else ''})") from e


def _adaptable(names: list[str], linears: list[list[Any]], skip: set[str]) -> bool:
    """Whether every target name matches a linear module that is not a router (peft's rule: the
    module's name or its last dotted parts); when not, validation refuses the targets by name."""
    hits = [n for n, *_ in linears if n not in skip]
    return all(any(n == t or n.endswith("." + t) for n in hits) for t in names) and not any(
        n == t or n.endswith("." + t) for n in skip for t in names
    )


def describe_hf(hf: Any, targets: list[str] | None = None) -> dict[str, Any]:
    """The description of the causal LM `hf` (a transformers config) builds. `targets`: the LoRA
    target names (None: every linear layer but the output head and the routers, the job's
    all-linear); the adapters are those of the peft model built from them on the meta device,
    with the job's own LoraConfig (peft may rewrite the names: MoE families), at rank 1 (every
    adapter's size is linear in the rank)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from pipeline.train.model import all_linear, lora_config, routers, with_attention

    kwargs: dict[str, Any] = {}
    if _top_k(hf) is not None:  # routed experts without data-dependent control flow on meta
        kwargs["experts_implementation"] = "batched_mm"
    with _step("transformers' AutoModelForCausalLM.from_config on the meta device"), torch.device("meta"):
        model = with_attention(AutoModelForCausalLM.from_config, hf, **kwargs)
    model.train()
    if any(n.rsplit(".", 1)[-1] == "encoder" for n, _ in model.named_modules()):
        raise DescribeError(
            f"{type(model).__name__} is an encoder (bidirectional attention), not a decoder-only causal "
            "language model"
        )
    linear_types = _linear_classes()
    head = model.get_output_embeddings()
    modules = dict(model.named_modules())
    head_name = next(n for n, m in modules.items() if m is head)
    tensors, owners = [], {}
    for pname, p in model.named_parameters():  # a tied weight once
        mname, _, leaf = pname.rpartition(".")
        kind = _kind(modules[mname], leaf, p, linear_types)
        tensors.append([pname, p.numel(), kind, list(p.shape)])
        if kind in ("linear", "expert", "router"):
            owners[mname] = modules[mname]
    linears = [
        [n, *_in_out(m), getattr(m, "bias", None) is not None]
        for n, m in modules.items()
        if isinstance(m, nn.Module) and isinstance(m, linear_types)
    ]
    # routed experts: batched_mm (the only meta-safe kernel) saves every token's gathered expert
    # weights, which the job's kernel does not: not measured (the formula applies)
    with _step("the activations' forward on the meta device"):
        activations = _activations(model) if _top_k(hf) is None else None
    tie = bool(head is not None and head.weight is model.get_input_embeddings().weight)
    embedding = model.get_input_embeddings().weight
    base = {
        "version": DESCRIPTION_FORMAT,
        "family": hf.model_type,
        "params": sum(t[1] for t in tensors),
        "tie_embeddings": tie,
        "vocab_size": int(embedding.shape[0]),
        "hidden": int(embedding.shape[1]),
        "n_layers": int(getattr(hf, "num_hidden_layers", 0) or getattr(hf, "n_layer", 0)),
        "top_k": _top_k(hf),
        "head": head_name,
        "tensors": tensors,
        "linears": linears,
        "routers": sorted(routers(model)),
        "activations": activations,
        "requested": sorted(targets) if targets else None,
    }
    given = list(targets) if targets else all_linear(model)
    names = {id(m): n for n, m in modules.items()}
    trained: nn.Module = model
    adapters: list[list[Any]] = []
    if given and _adaptable(given, linears, set(base["routers"])):
        with _step(f"peft's get_peft_model with LoRA targets {given}"):
            trained = get_peft_model(model, lora_config(model, given, rank=1))
            adapters = _adapters(trained, names)
        trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
        if trainable != sum(a * (i + o) for _, i, o, a, _ in adapters):
            raise DescribeError(
                f"peft built trainable parameters that are not LoRA adapters ({trainable} at r=1)"
            )
    else:
        for p in model.parameters():
            p.requires_grad_(False)
    with _step("a forward of the adapted model on the meta device"), meta_autocast():
        probe = _probe(trained, hf, owners)
    return {**base, "adapters": adapters, "targets": sorted(a[0] for a in adapters), **probe}


def describe_model(cfg: ModelConfig, targets: list[str] | None = None) -> dict[str, Any]:
    """The description of the model a ModelConfig builds (pipeline/train/model.py's hf_config),
    with the folder and the sha256 of its config.json when it is the user's own."""
    from pipeline.train.model import hf_config

    out = describe_hf(hf_config(cfg), targets)
    if cfg.pretrained:
        from pipeline.config.pretrained import read_pretrained

        folder = read_pretrained(cfg.pretrained).folder
        out["folder"] = str(folder)
        out["config_sha256"] = hashlib.sha256((Path(folder) / "config.json").read_bytes()).hexdigest()
    return out


def describe_request(request: dict[str, Any]) -> dict[str, Any]:
    """{"model": {ModelConfig fields}, "targets": [...] | null} -> the description."""
    return describe_model(ModelConfig(**request["model"]), request.get("targets"))


describe_in_process(describe_request)  # this process has torch: no helper process needed


def main() -> None:
    """stdin: a request (describe_request); stdout: the description."""
    json.dump(describe_request(json.load(sys.stdin)), sys.stdout)


def measure_saved_bytes(model: nn.Module, batch: int, tokens: int, vocab: int) -> int:
    """What a forward of the real model on this device saves for backward: the bytes of the
    distinct storages autograd holds (saved-tensor hooks, by data pointer), parameters excluded.
    The reference the description's meta measurement is checked against."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}
    keep: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() not in seen:
            seen[st.data_ptr()] = st.nbytes()
            keep.append(t)
        return t

    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (batch, tokens), device=device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, use_cache=False)
    return sum(seen.values())


if __name__ == "__main__":
    main()
