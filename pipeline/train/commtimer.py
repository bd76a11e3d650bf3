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
from collections.abc import Callable, Mapping
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
    """One collective's totals over a window: calls, nccl-tests bytes, bus bytes, seconds in the
    calls (the transfer, and waits on async handles) and seconds waiting for the other ranks at
    the barrier before each call (the skew)."""

    calls: int = 0
    nbytes: int = 0
    wire_bytes: float = 0.0
    blocked_s: float = 0.0
    skew_s: float = 0.0
    sizes: list[int] = field(default_factory=list)  # each call's bytes, in order


@dataclass
class CommCounts:
    """Every collective issued in a window, by nccl-tests op name."""

    ops: dict[str, OpTotals] = field(default_factory=dict)

    def add(self, op: str, nbytes: int, n: int, seconds: float, skew_s: float = 0.0) -> None:
        t = self.ops.setdefault(op, OpTotals())
        t.skew_s += skew_s
        t.calls += 1
        t.nbytes += nbytes
        t.wire_bytes += nbytes * bus_factor(n, op)
        t.blocked_s += seconds
        t.sizes.append(nbytes)

    @property
    def blocked_s(self) -> float:
        return sum(t.blocked_s for t in self.ops.values())

    @property
    def skew_s(self) -> float:
        return sum(t.skew_s for t in self.ops.values())

    @property
    def exposed_s(self) -> float:
        """What the step lost at its collectives: the transfers and the waits for other ranks."""
        return self.blocked_s + self.skew_s

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
    """While entered, every collective in SIZES that the entering thread issues adds to `counts`
    (the outermost call only: torch's `_all_gather_base` calls `all_gather_into_tensor`; not a
    background save's). `sync` synchronizes the device around each. `barrier`: a barrier of the
    collective's group before each, timed apart, so that the call's own time is its transfer and
    not the wait for a late rank (which the first collective of a backward otherwise absorbs)."""

    def __init__(self, sync: Callable[[], None] | None = None, barrier: bool = False) -> None:
        self.counts = CommCounts()
        self._barrier = barrier
        self._sync = sync or (lambda: None)
        self._depth = threading.local()
        self._saved: list[tuple[Any, str, Any]] = []
        self._owner = threading.get_ident()

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        op, size = SIZES[name]

        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._depth, "n", 0) or threading.get_ident() != self._owner:
                return fn(*args, **kwargs)  # nested, or another thread's (a background save)
            nbytes, group = size(args, kwargs), kwargs.get("group")
            n = dist.get_world_size(group)
            self._depth.n = 1
            self._sync()
            t0 = time.perf_counter()
            if self._barrier:
                dist.barrier(group=group)
                self._sync()
            skew, t0 = time.perf_counter() - t0, time.perf_counter()
            try:
                work = fn(*args, **kwargs)
                self._sync()
            finally:
                self._depth.n = 0
            blocked = time.perf_counter() - t0
            if work is None or not kwargs.get("async_op"):
                self.counts.add(op, nbytes, n, blocked, skew)
                return work
            return _TimedWork(work, lambda waited: self.counts.add(op, nbytes, n, blocked + waited, skew))

        return timed

    def _patch(self, owner: Any, attr: str, name: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is not None:
            self._saved.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(name, fn))

    def __enter__(self) -> CollectiveCounter:
        self._owner = threading.get_ident()
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


@dataclass
class StepSplit:
    """One step split (seconds), with the collectives it issued. compute = step - exposed
    communication - optimizer step - data wait: forward and backward, and what else the host did."""

    step_s: float
    compute_s: float
    exposed_s: float
    optimizer_s: float
    counts: CommCounts


def split_step(
    step_s: float, wait_s: float, engine_step_s: float, comm_in_step_s: float, counts: CommCounts
) -> StepSplit:
    """The split of one timed step (pure): the optimizer step is engine.step() less the
    collectives inside it (ZeRO-1/2's all-gather of the updated parameters)."""
    exposed = counts.exposed_s
    optimizer = max(0.0, engine_step_s - comm_in_step_s)
    return StepSplit(step_s, max(0.0, step_s - exposed - optimizer - wait_s), exposed, optimizer, counts)


EVERY = 4
"""Time one step in 4 (steps 4, 8, ...): the barriers (and on a GPU the synchronizations) slow
a timed step, and the run's throughput (the median step time) must stay the untimed steps'."""


class StepCommTimer:
    """A step hook (pipeline.train.trainer's StepHook and InStepHook) that times every `every`-th
    step after the first it sees: it wraps the trainer's train_step and the engine's step on that
    first call (so the trainer needs no change), and logs the split after each timed step
    through `metrics`."""

    def __init__(
        self,
        device: str,
        every: int = EVERY,
        metrics: Callable[[StepSplit, int], Mapping[str, float]] | None = None,
    ) -> None:
        """metrics: a split (and the world size) -> what to log through the trainer's sink (the
        MLflow keys live outside pipeline.train: pipeline.job.commsplit.step_metrics)."""
        self.every = every
        self.metrics = metrics
        self.sync = device_sync(device)
        self.splits: dict[int, StepSplit] = {}
        self._wrapped = False
        self._engine_step: list[float] = [0.0, 0.0]  # seconds in engine.step(), comm inside it
        self._counts: CommCounts | None = None  # the last timed step's, until after_step reads it

    def in_step(self, trainer: Any, step: int) -> None:
        if self._wrapped:
            return
        self._wrapped = True
        train_step, engine_step = trainer.train_step, trainer.engine.step
        counter: list[CollectiveCounter] = []

        def timed_engine_step(*args: Any, **kwargs: Any) -> Any:
            before, t0 = counter[0].counts.exposed_s if counter else 0.0, time.perf_counter()
            try:
                return engine_step(*args, **kwargs)
            finally:
                self._engine_step[0] += time.perf_counter() - t0
                self._engine_step[1] += (counter[0].counts.exposed_s if counter else 0.0) - before

        def timed_train_step(n: int) -> Any:
            if n % self.every:
                return train_step(n)
            self._engine_step = [0.0, 0.0]
            with CollectiveCounter(self.sync, barrier=True) as c:
                counter[:] = [c]
                try:
                    return train_step(n)
                finally:
                    counter.clear()
                    self._counts = c.counts

        trainer.train_step, trainer.engine.step = timed_train_step, timed_engine_step

    def after_step(self, trainer: Any, step: int) -> None:
        counts = self._counts
        if counts is None:
            return
        self._counts = None
        res = trainer.result
        in_step_s, comm_in_step_s = self._engine_step
        split = split_step(
            res.step_times[step], res.data_wait.get(step, 0.0), in_step_s, comm_in_step_s, counts
        )
        self.splits[step] = split
        if self.metrics is not None:
            trainer.sink.log_metrics(self.metrics(split, trainer.world_size), step=step)
