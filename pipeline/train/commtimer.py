"""Timers around the collectives DeepSpeed issues: per step, the calls, their bytes (nccl-tests'
size: all-gather the whole output, reduce-scatter the whole input) and the time this rank was
blocked in them, which splits the step into compute, exposed communication and optimizer step.

Why timers around the collectives (and not DeepSpeed's `wall_clock_breakdown`): its timers split
forward / backward / step, but ZeRO's collectives run inside them (ZeRO-1/2's all-gather inside
the step, ZeRO-3's inside forward and backward), so they cannot say how much of a step was
communication; the profiler can, but its trace per step costs more than the step on a CPU.
Wrapping torch.distributed's collectives (and the two DeepSpeed captures at init,
`cdb.all_gather_function` and `cdb.reduce_scatter_function`) sees every call with its tensors.

What the time means: the host time spent inside a synchronous collective, plus the time spent in
`wait()` on an asynchronous one, i.e. the communication the step was not hiding behind compute
(exposed). Over gloo (CPU) a synchronous collective blocks the calling thread until it is done.
On a GPU NCCL returns once the kernel is queued, so the timer synchronizes the device before and
after each collective: then the figure is all the communication time (overlap removed), an upper
bound of the exposed part, and the timed steps are a little slower.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pipeline.measure.comm import bus_factor


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs[name]


# torch.distributed name -> (nccl-tests op, the size of one call from its arguments)
SIZES: dict[str, tuple[str, Callable[[tuple, dict], int]]] = {
    "all_reduce": ("all_reduce", lambda a, k: _nbytes(_arg(a, k, 0, "tensor"))),
    "all_reduce_coalesced": ("all_reduce", lambda a, k: sum(map(_nbytes, _arg(a, k, 0, "tensors")))),
    "reduce": ("reduce", lambda a, k: _nbytes(_arg(a, k, 0, "tensor"))),
    "broadcast": ("broadcast", lambda a, k: _nbytes(_arg(a, k, 0, "tensor"))),
    "all_gather": ("all_gather", lambda a, k: sum(map(_nbytes, _arg(a, k, 0, "tensor_list")))),
    "all_gather_into_tensor": ("all_gather", lambda a, k: _nbytes(_arg(a, k, 0, "output_tensor"))),
    "all_gather_single": ("all_gather", lambda a, k: _nbytes(_arg(a, k, 0, "output_tensor"))),
    "_all_gather_base": ("all_gather", lambda a, k: _nbytes(_arg(a, k, 0, "output_tensor"))),
    "reduce_scatter": ("reduce_scatter", lambda a, k: sum(map(_nbytes, _arg(a, k, 1, "input_list")))),
    "reduce_scatter_tensor": ("reduce_scatter", lambda a, k: _nbytes(_arg(a, k, 1, "input"))),
    "reduce_scatter_single": ("reduce_scatter", lambda a, k: _nbytes(_arg(a, k, 1, "input"))),
    "_reduce_scatter_base": ("reduce_scatter", lambda a, k: _nbytes(_arg(a, k, 1, "input"))),
}


@dataclass
class OpTotals:
    """One collective's totals over a window: calls, nccl-tests bytes, bus bytes, blocked seconds."""

    calls: int = 0
    nbytes: int = 0
    wire_bytes: float = 0.0
    blocked_s: float = 0.0
    sizes: list[int] = field(default_factory=list)  # each call's bytes, in order


@dataclass
class CommCounts:
    """Every collective issued in a window, by nccl-tests op name."""

    ops: dict[str, OpTotals] = field(default_factory=dict)

    def add(self, op: str, nbytes: int, n: int, seconds: float) -> None:
        t = self.ops.setdefault(op, OpTotals())
        t.calls += 1
        t.nbytes += nbytes
        t.wire_bytes += nbytes * bus_factor(n, op)
        t.blocked_s += seconds
        t.sizes.append(nbytes)

    @property
    def blocked_s(self) -> float:
        return sum(t.blocked_s for t in self.ops.values())

    @property
    def wire_bytes(self) -> float:
        return sum(t.wire_bytes for t in self.ops.values())


class _TimedWork:
    """An async collective's handle: the time in wait() counts as exposed communication."""

    def __init__(self, work: Any, done: Callable[[float], None]) -> None:
        self._work, self._done = work, done

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._done(time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class CollectiveCounter:
    """While entered, every collective in SIZES adds to `counts` (the outermost call only: torch's
    `_all_gather_base` calls `all_gather_into_tensor`). `sync` synchronizes the device around each."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.counts = CommCounts()
        self._sync = sync or (lambda: None)
        self._depth = threading.local()
        self._saved: list[tuple[Any, str, Any]] = []

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        op, size = SIZES[name]

        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._depth, "n", 0):
                return fn(*args, **kwargs)
            nbytes, group = size(args, kwargs), kwargs.get("group")
            n = dist.get_world_size(group)
            self._depth.n = 1
            self._sync()
            t0 = time.perf_counter()
            try:
                work = fn(*args, **kwargs)
                self._sync()
            finally:
                self._depth.n = 0
            blocked = time.perf_counter() - t0
            if work is None or not kwargs.get("async_op"):
                self.counts.add(op, nbytes, n, blocked)
                return work
            return _TimedWork(work, lambda waited: self.counts.add(op, nbytes, n, blocked + waited))

        return timed

    def _patch(self, owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is not None:
            self._saved.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(name, fn))

    def __enter__(self) -> CollectiveCounter:
        for name in SIZES:  # torch.distributed re-exports distributed_c10d's: patch both names
            fn = getattr(c10d, name, None) or getattr(dist, name, None)
            if fn is None:
                continue
            wrapped = self._wrap(name, fn)
            for owner in (dist, c10d):
                if getattr(owner, name, None) is fn:
                    self._saved.append((owner, name, fn))
                    setattr(owner, name, wrapped)
        cdb = _deepspeed_backend()
        for attr in ("all_gather_function", "reduce_scatter_function"):
            fn = getattr(cdb, attr, None)
            if fn is not None and getattr(fn, "__name__", "") in SIZES:
                self._patch(cdb, attr, fn.__name__)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, attr, fn in reversed(self._saved):
            setattr(owner, attr, fn)
        self._saved.clear()


def _deepspeed_backend() -> Any:
    """DeepSpeed's torch backend, which captured all_gather_into_tensor / reduce_scatter_tensor
    at init (deepspeed/comm/torch.py); None before DeepSpeed is initialized."""
    try:
        from deepspeed import comm as ds_comm
    except ImportError:  # pragma: no cover - DeepSpeed is a dependency
        return None
    return getattr(ds_comm.comm, "cdb", None)


def device_sync(device: str) -> Callable[[], None] | None:
    """The device synchronization the timer needs (module docstring): CUDA only."""
    return torch.cuda.synchronize if device == "cuda" else None
