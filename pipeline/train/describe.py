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

import hashlib
import json
import re
import sys
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


def _probe(model: nn.Module, hf: Any, targets: set[str], owners: dict[str, nn.Module]) -> dict[str, Any]:
    """One forward on the meta device with every weight frozen and each targeted linear's output
    made to depend on a trainable scalar (what a LoRA adapter does): which matmul owners get an
    input that needs a gradient, and each attention call."""
    from transformers import DynamicCache

    for p in model.parameters():
        p.requires_grad_(False)
    trainable = torch.zeros((), device="meta", requires_grad=True)
    needs: dict[str, bool] = {}
    handles = []
    for name, mod in owners.items():

        def pre(_m: nn.Module, args: Any, kwargs: Any, name: str = name) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            needs[name] = bool(getattr(x, "requires_grad", False))

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        if name in targets:
            handles.append(mod.register_forward_hook(lambda _m, _a, out: out + trainable))
    calls = _AttentionCalls()
    ids = torch.zeros(1, _PROBE_TOKENS, dtype=torch.long, device="meta")
    try:
        with calls:  # an (empty) cache skips the packed-sequence check, which reads a meta value
            model(input_ids=ids, past_key_values=DynamicCache(config=hf), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return {"input_grad": needs, "attention": [list(c) for c in calls.calls]}


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


def _matched(name: str, targets: list[str]) -> bool:
    """peft's rule for a list of target names: the module's name, or its last dotted parts."""
    return any(name == t or name.endswith("." + t) for t in targets)


def describe_hf(hf: Any, targets: list[str] | None = None) -> dict[str, Any]:
    """The description of the causal LM `hf` (a transformers config) builds. `targets`: the LoRA
    target names whose adapters the gradient probe simulates (None: every linear layer but the
    output head, peft's "all-linear")."""
    from transformers import AutoModelForCausalLM

    from pipeline.train.model import with_attention

    kwargs: dict[str, Any] = {}
    if _top_k(hf) is not None:  # routed experts without data-dependent control flow on meta
        kwargs["experts_implementation"] = "batched_mm"
    with torch.device("meta"):
        model = with_attention(AutoModelForCausalLM.from_config, hf, **kwargs)
    model.train()
    if any(n.rsplit(".", 1)[-1] == "encoder" for n, _ in model.named_modules()):
        raise ValueError(
            f"{type(model).__name__} is an encoder (bidirectional attention), not a decoder-only model"
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
    given = targets or sorted({n.rsplit(".", 1)[-1] for n, *_ in linears if n != head_name})
    hit = {n for n, *_ in linears if _matched(n, given) and (targets or n != head_name)}
    # routed experts: batched_mm (the only meta-safe kernel) saves every token's gathered expert
    # weights, which the job's kernel does not: not measured (the formula applies)
    activations = _activations(model) if _top_k(hf) is None else None
    probe = _probe(model, hf, hit, owners)
    tie = bool(head is not None and head.weight is model.get_input_embeddings().weight)
    return {
        "version": DESCRIPTION_FORMAT,
        "family": hf.model_type,
        "params": sum(t[1] for t in tensors),
        "tie_embeddings": tie,
        "vocab_size": int(model.get_input_embeddings().weight.shape[0]),
        "hidden": int(model.get_input_embeddings().weight.shape[1]),
        "n_layers": int(getattr(hf, "num_hidden_layers", 0) or getattr(hf, "n_layer", 0)),
        "top_k": _top_k(hf),
        "head": head_name,
        "tensors": tensors,
        "linears": linears,
        "targets": sorted(hit),
        "activations": activations,
        **probe,
    }


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
