"""The bytes of the model-state tensors one rank really holds, read from the DeepSpeed engine:
the measured side of the memory model (pipeline.measure.memory) on CPU, where no allocator
statistics exist. Sum of storage bytes (numel x element size), each storage counted once, so
views into DeepSpeed's flat buffers are not counted twice."""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

import torch

CATEGORIES = ("params", "grads", "optimizer", "other")


def _storages(tensors: Iterable[Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            if s.nbytes():
                out[s.data_ptr()] = s.nbytes()
    return out


def _zero_optimizer(engine: Any) -> tuple[Any, Any]:
    """(DeepSpeed's ZeRO wrapper or None, the torch optimizer that steps the fp32 partitions)."""
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None)
    return (opt, inner) if inner is not None else (None, opt)


def state_bytes(engine: Any) -> dict[str, int]:
    """Bytes per category on this rank, right now. params: the model's weights (ZeRO-3: this
    rank's partitions plus persistent or gathered parameters); optimizer: the inner optimizer's
    parameters (DeepSpeed's fp32 master partitions) and its state (Adam m, v); grads: gradients
    of both (16-bit and fp32) and DeepSpeed's gradient-partition buffers; other: every other
    live tensor of the process (communication buckets, inputs, tables)."""
    wrapper, inner = _zero_optimizer(engine)
    params = list(engine.module.parameters())
    own_params = [getattr(p, "ds_tensor", None) for p in params] + [p.data for p in params]
    opt_tensors: list[Any] = []
    grad_tensors: list[Any] = [p.grad for p in params]
    if inner is not None:
        for group in inner.param_groups:
            opt_tensors += list(group["params"])
            grad_tensors += [p.grad for p in group["params"]]
        for st in inner.state.values():
            opt_tensors += [v for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    if wrapper is not None:
        grad_tensors.append(getattr(wrapper, "grad_partitions_flat_buffer", None))  # ZeRO-3
        avg = getattr(wrapper, "averaged_gradients", None)  # ZeRO-1/2
        if isinstance(avg, dict):
            grad_tensors += [t for ts in avg.values() for t in (ts or [])]
    claimed: dict[int, str] = {}
    sizes: dict[int, int] = {}
    for cat, tensors in (("params", own_params), ("optimizer", opt_tensors), ("grads", grad_tensors)):
        for ptr, n in _storages(tensors).items():
            claimed.setdefault(ptr, cat)
            sizes[ptr] = n
    gc.collect()
    everything = _storages(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
    for ptr, n in everything.items():
        claimed.setdefault(ptr, "other")
        sizes[ptr] = n
    out = dict.fromkeys(CATEGORIES, 0)
    for ptr, cat in claimed.items():
        out[cat] += sizes[ptr]
    return out
