"""The OOM-safe micro-batch search inside one allocation (search.micro_batch=true).

Start from the predicted size, double until the first out-of-memory (or a peak over the
headroom) or the cap, then bisect between the largest size that fits and the smallest that does
not. Each trial builds a fresh engine, runs `search.steps` optimizer steps and is dropped, its
memory freed, before the next. The ranks agree after every phase (engine build, forward,
backward, step) with one all-reduce of a flag, so an out-of-memory on one rank ends the trial on
every rank at the same point instead of leaving the others in a collective. On CPU the job runs
under a real address-space limit (RLIMIT_AS) of the partition's device memory above what the
process already maps, so the search meets real allocation failures; a trial runs under that
limit less the headroom, so the size found leaves the headroom to the run.
"""

from __future__ import annotations

import contextlib
import gc
import resource
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from pipeline.job.results import is_oom


@dataclass(frozen=True)
class Trial:
    micro_batch: int
    fits: bool
    oom: bool  # a real allocation failure on some rank (else: ran, maybe over the headroom)
    peak_bytes: int  # max over ranks: CUDA max allocated, or peak RSS on CPU
    tokens_per_s: float | None  # None: no step completed
    error: str = ""


@dataclass(frozen=True)
class SearchResult:
    micro_batch: int  # 0: not even the smallest tried size fits
    trials: tuple[Trial, ...]
    wall_s: float

    def as_json(self) -> dict[str, Any]:
        return {
            "micro_batch": self.micro_batch,
            "wall_s": self.wall_s,
            "trials": [asdict(t) for t in self.trials],
        }


def next_size(tried: Sequence[tuple[int, bool]], start: int, cap: int) -> int | None:
    """The next micro-batch to try given (size, fits) so far, or None when the search is done.
    Doubling from `start` while every size fits (up to `cap`), then bisection between the
    largest fit and the smallest failure."""
    if not tried:
        return min(start, cap)
    fits = [b for b, ok in tried if ok]
    fails = [b for b, ok in tried if not ok]
    lo = max(fits, default=0)
    if not fails:
        return None if lo >= cap else min(2 * lo, cap)
    hi = min(fails)
    if hi - lo <= 1:
        return None
    return (lo + hi) // 2


# --- memory limit and peaks (CPU: /proc; GPU: the CUDA allocator) ----------------------------
def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def vm_bytes() -> int:
    """This process's address space now (VmSize), what RLIMIT_AS counts."""
    return _vm_bytes()


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL("libc.so.6")


def limit_cpu_memory(limit_bytes: int) -> None:
    """Cap this process's address space (RLIMIT_AS) at limit_bytes: past it an allocation fails
    for real (PyTorch raises "can't allocate memory"). Large blocks go to mmap (a fixed
    M_MMAP_THRESHOLD of 1 MiB) so that what a dropped engine freed leaves the address space
    instead of staying in glibc's heap, where it would count against the next trial."""
    with contextlib.suppress(OSError):
        _libc().mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
        # M_ARENA_MAX: one heap for every thread. glibc reserves 64 MiB of address space per
        # thread arena (up to 8 per core): a thread pool first used inside a trial (OpenMP's,
        # gloo's) would count hundreds of MiB of reservations, never touched, as the trial's.
        _libc().mallopt(-8, 1)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, hard))


@contextlib.contextmanager
def _unlimited() -> Iterator[None]:
    """Lift this process's address-space limit (to its hard limit) for a while; what was mapped
    meanwhile is added to the limit restored after, so it does not count against what follows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        yield
        return
    before = vm_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    try:
        yield
    finally:
        grown = max(0, vm_bytes() - before)
        resource.setrlimit(
            resource.RLIMIT_AS,
            (soft + grown if hard == resource.RLIM_INFINITY else min(soft + grown, hard), hard),
        )


def _trim() -> None:
    with contextlib.suppress(OSError):
        _libc().malloc_trim(0)


def _reset_peak(device: str) -> int:
    """Start a trial's peak; returns the baseline the peak is measured above (CPU)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return 0
    try:
        with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current RSS
            f.write("5")
    except OSError:
        pass
    return 0


def _peak(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _agree(ok: bool, device: str) -> bool:
    """True when every rank is ok: one all-reduce (MIN) of a flag, in the world group."""
    t = torch.tensor([1 if ok else 0], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _max_int(value: int, device: str) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


@contextlib.contextmanager
def trial_group(timeout_s: float) -> Iterator[Any]:
    """A fresh process group, with a short timeout, for one trial's engine.

    DeepSpeed runs an engine's collectives (ZeRO's gradient reduce, its all-gathers) on its own
    clone of the world group (`deepspeed.utils.groups._clone_world_group`), made once and kept.
    At the memory boundary one rank can fail an allocation *between* two of those collectives
    (flattening a gradient bucket) while its peer already waits inside the next one: the failed
    rank goes to the agreement in the world group, the peer waits for a partner that will not
    come. With the trial's own group the peer's wait ends after `timeout_s`, it reads that as
    the trial failing on another rank, and both agree in the world group, which stayed in step.
    The trial's group is dropped after the trial: a collective one rank skipped leaves a group's
    sequence of collectives out of step for good. The run after the search gets a new clone with
    the job's own timeout."""
    from datetime import timedelta

    from deepspeed.utils import groups

    with _unlimited():  # the group's threads and buffers are the job's, not the trial's
        group = dist.new_group(ranks=list(range(dist.get_world_size())), timeout=timedelta(seconds=timeout_s))
    kept = groups._WORLD_GROUP
    groups._WORLD_GROUP = group
    try:
        yield group
    finally:
        groups._WORLD_GROUP = kept
        with contextlib.suppress(Exception):  # a group with a timed-out collective may refuse
            dist.destroy_process_group(group)


PEER_FAILED = "another rank failed the trial: "


class _Phases:
    """The phases of one trial (engine build, then forward, backward and step per step), each
    ended by one agreement of every rank. A rank that runs out of memory records the error and
    reports failure; a rank whose collective timed out in the trial's group (its peer failed
    outside a collective, see `trial_group`) reports failure too. Anything else is not the
    trial's to judge and propagates."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.error = ""
        self.box: dict[str, Any] = {}

    def run(self, fn: Any) -> bool:
        from pipeline.job.drills import is_peer_failure

        try:
            fn()
            return _agree(True, self.device)
        except Exception as e:
            if not (is_oom(e) or is_peer_failure(e)):
                raise
            first = str(e).splitlines()[0][:300] if str(e) else ""
            cause = "" if is_oom(e) else PEER_FAILED
            self.error = self.error or f"{cause}{type(e).__name__}: {first}"
            return _agree(False, self.device)


def _train_steps(cfg: Any, ph: _Phases, micro_batch: int, engine: Any) -> float | None:
    """cfg.search.steps optimizer steps at `micro_batch`, rows as long as the longest the data
    gives a micro-batch (data_row_len: model.seq_len, or a padded chat set's longest sample);
    the last step's seconds, None when a phase failed on some rank."""
    from pipeline.config.validate import data_row_len
    from pipeline.train.data import SyntheticTask

    task = SyntheticTask(cfg.model.vocab_size, data_row_len(cfg), cfg.train.seed, cfg.data.alphabet)
    box, device, step_s = ph.box, ph.device, None
    for step in range(1, cfg.search.steps + 1):
        x, y = task.batch(step, 0, dist.get_rank(), micro_batch)
        box["x"], box["y"] = x.to(device), y.to(device)
        t0 = time.perf_counter()

        def forward() -> None:
            box["loss"] = engine(box["x"], box["y"])

        def backward() -> None:
            engine.backward(box.pop("loss"))

        if not (ph.run(forward) and ph.run(backward) and ph.run(engine.step)):
            return None
        if device == "cuda":
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t0
    return step_s


def _release(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    else:
        _trim()


def run_trial(cfg: Any, micro_batch: int, device: str, capacity_bytes: int, baseline_bytes: int) -> Trial:
    """Build an engine at `micro_batch`, run cfg.search.steps steps, drop it. fits: no rank ran
    out of memory and the peak above the process's baseline leaves cfg.search.headroom free."""
    from pipeline.train.trainer import build_ds_config, build_engine

    par = replace(cfg.parallelism, micro_batch=micro_batch)
    ph = _Phases(device)
    _reset_peak(device)
    with trial_group(cfg.search.trial_timeout_s):

        def build() -> None:
            ph.box["engine"] = build_engine(
                cfg.model, par, cfg.train, build_ds_config(par, cfg.precision, cfg.train)
            )

        ok = ph.run(build)
        step_s = _train_steps(cfg, ph, micro_batch, ph.box["engine"]) if ok else None
        ok = ok and step_s is not None
        ph.box.clear()  # the engine and its group's last references go before the group
    peak = _max_int(max(0, _peak(device) - baseline_bytes), device)
    _release(device)
    # GPU: the measured peak leaves the headroom; CPU: the trial ran under a limit already
    # reduced by the headroom (see `search`), so running is fitting
    fits = ok and (device != "cuda" or (capacity_bytes - peak) >= cfg.search.headroom * capacity_bytes)
    from pipeline.config.validate import data_row_len

    row = data_row_len(cfg)
    tokens = micro_batch * dist.get_world_size() * row / step_s if ok and step_s else None
    return Trial(micro_batch, fits, not ok, peak, tokens, _first_cause(ph.error))


def _first_cause(error: str) -> str:
    """The trial's error as the rank that failed first saw it: every rank's error, gathered, the
    ones that only waited for another rank last."""
    errors: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return sorted((e for e in errors if e), key=lambda e: e.startswith(PEER_FAILED))[0] if any(errors) else ""


def search(
    cfg: Any, device: str, capacity_bytes: int, start: int, log: Any = None, vm_base: int | None = None
) -> SearchResult:
    """The whole search; `log(trial_index, trial)` is called after each trial. On CPU each trial
    runs under RLIMIT_AS = vm_base + (1 - search.headroom) x capacity, a size that runs there
    leaves the headroom free; the caller sets the run's own limit (vm_base + capacity) after."""
    t0 = time.perf_counter()
    gc.collect()
    baseline = 0
    if device != "cuda":
        baseline = _max_int(_peak(device), device)
        base = vm_bytes() if vm_base is None else vm_base
        limit_cpu_memory(base + int((1 - cfg.search.headroom) * capacity_bytes))
    trials: list[Trial] = []
    while (size := next_size([(t.micro_batch, t.fits) for t in trials], start, cfg.search.cap)) is not None:
        trial = run_trial(cfg, size, device, capacity_bytes, baseline)
        trials.append(trial)
        if log is not None:
            log(len(trials) - 1, trial)
    found = max((t.micro_batch for t in trials if t.fits), default=0)
    return SearchResult(found, tuple(trials), time.perf_counter() - t0)
