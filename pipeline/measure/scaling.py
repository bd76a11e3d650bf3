"""Communication at N ranks: the bytes a ZeRO stage moves per step, an alpha-beta fit of timed
collectives, and step time(N) = compute + exposed communication(N). Pure; standard library only.

Sources (docs/design.md, "Communication" and "Projection"):

- Volumes per step (Rajbhandari et al. 2020, "ZeRO", section 7.2, with Psi the model's parameter
  count): plain data parallelism all-reduces the gradients, 2 Psi per rank on the wire (a
  reduce-scatter then an all-gather); ZeRO-1/2 (P_os, P_os+g) reduce-scatter the gradients and
  all-gather the updated parameters after the step, also 2 Psi; ZeRO-3 (P_os+g+p) all-gathers the
  parameters in forward and again in backward and reduce-scatters the gradients, 3 Psi.
- Wire bytes per rank from an operation's nccl-tests size S (all-gather: the whole output;
  reduce-scatter: the whole input): S x the bus factor of nccl-tests' doc/PERFORMANCE.md,
  2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather (`comm.bus_factor`).
- Time of one operation (Hockney's alpha-beta model; ring and tree costs of Thakur, Rabenseifner
  and Gropp 2005, "Optimization of collective communication operations in MPICH"):
  t = steps(n) x alpha + S x bus_factor(n) x beta, alpha the latency per step, beta = 1 / the bus
  bandwidth. Ring: steps = 2(n-1) for all-reduce, n-1 for reduce-scatter and all-gather. Tree (NCCL
  uses a double binary tree for all-reduce only): steps = 2 ceil(log2 n).
  Which one NCCL picks depends on its tuning tables (size, nodes, NCCL version); this model
  assumes ring for every operation at or above `TREE_BELOW_BYTES` and tree for all-reduce below
  it. ZeRO's buckets are hundreds of MB (DeepSpeed's reduce_bucket_size default is 5e8
  elements), where NCCL runs ring: the step model is a ring model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from pipeline.measure.comm import bus_factor
from pipeline.measure.kinds import PRECISIONS
from pipeline.measure.memory import weight_bytes

STAGES = (0, 1, 2, 3)
TREE_BELOW_BYTES = 1 << 20
"""All-reduce messages under 1 MiB are modelled as NCCL's tree, at and above as a ring: an
approximation of NCCL's tuner, which picks tree for small messages across nodes."""
DEFAULT_BUCKET_BYTES = 5e8 * 2
"""DeepSpeed's reduce_bucket_size / allgather_bucket_size default (5e8 elements), in bf16 bytes."""


@dataclass(frozen=True)
class Collective:
    """One collective a ZeRO step issues: the operation, its nccl-tests size in bytes, and when."""

    op: str
    size_bytes: float
    phase: str  # "forward", "backward" or "after step"


VOLUMES = ("paper", "deepspeed")
"""paper: the ZeRO paper's collectives. deepspeed: what DeepSpeed 0.19 issues with its defaults,
counted over gloo (tests/integration/test_scaling_deepspeed.py): ZeRO-1/2 all-reduce the gradient buckets
(`use_multi_rank_bucket_allreduce`, default true; false sends one reduce per owner) instead of
reduce-scattering them, so they move 3 Psi, not 2 Psi. ZeRO-3 is the paper's when parameters are
released between forward and backward (counted with stage3_max_reuse_distance,
stage3_param_persistence_threshold and stage3_prefetch_bucket_size at 0); with the defaults a
263k-parameter model stays gathered into backward and skips its all-gather. Whether a production
model re-gathers with the defaults was not measured: the model keeps the paper's 3 Psi for it."""


def zero_collectives(
    stage: int, param_bytes: float, grad_bytes: float | None = None, volume: str = "paper"
) -> tuple[Collective, ...]:
    """The collectives of one optimizer step at ZeRO `stage`: sizes are the whole model's
    parameters / gradients in their communicated dtype; `volume` as in VOLUMES."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
    if volume not in VOLUMES:
        raise ValueError(f"volume must be one of {VOLUMES}, got {volume!r}")
    if not (param_bytes >= 0 and math.isfinite(param_bytes)):
        raise ValueError(f"parameter bytes must be a finite number >= 0, got {param_bytes!r}")
    grads = param_bytes if grad_bytes is None else grad_bytes
    if stage == 0:
        return (Collective("all_reduce", grads, "backward"),)
    if stage in (1, 2):
        reduce = "reduce_scatter" if volume == "paper" else "all_reduce"
        return (
            Collective(reduce, grads, "backward"),
            Collective("all_gather", param_bytes, "after step"),
        )
    return (
        Collective("all_gather", param_bytes, "forward"),
        Collective("all_gather", param_bytes, "backward"),
        Collective("reduce_scatter", grads, "backward"),
    )


def wire_bytes_per_rank(collectives: Sequence[Collective], n: int) -> float:
    """Bytes each rank sends (and receives) per step: sum of size x bus factor (PERFORMANCE.md)."""
    return sum(c.size_bytes * bus_factor(n, c.op) for c in collectives)


def latency_steps(op: str, n: int, size_bytes: float) -> float:
    """The alpha-multiplier of one operation: ring 2(n-1) for all-reduce and n-1 for
    reduce-scatter/all-gather; tree 2 ceil(log2 n) for all-reduce under TREE_BELOW_BYTES."""
    bus_factor(n, op)  # validates
    if n == 1:
        return 0.0
    if op == "all_reduce":
        return 2 * math.ceil(math.log2(n)) if size_bytes < TREE_BELOW_BYTES else 2 * (n - 1)
    if op in ("reduce_scatter", "all_gather"):
        return n - 1
    return math.ceil(math.log2(n))  # broadcast, reduce: a tree


@dataclass(frozen=True)
class Timing:
    """Timed collectives of one kind: the operation, the nccl-tests bytes of `calls` calls in all,
    the ranks, and their seconds in all (a step's totals, or one call)."""

    op: str
    size_bytes: float
    n: int
    seconds: float
    calls: int = 1
    classes: tuple[tuple[float, int], ...] = ()
    """The calls' size classes (bytes a message, how many); empty: all at their mean size."""

    def sizes(self) -> tuple[tuple[float, int], ...]:
        return self.classes or ((self.size_bytes / max(1, self.calls), max(1, self.calls)),)

    def regressors(self) -> tuple[float, float]:
        """(latency steps, wire bytes) of these calls, each size class at its own size."""
        steps = sum(k * latency_steps(self.op, self.n, size) for size, k in self.sizes())
        return steps, self.size_bytes * bus_factor(self.n, self.op)


@dataclass(frozen=True)
class AlphaBeta:
    """A least-squares fit t = alpha x steps + beta x wire bytes, and the covariance of
    (alpha, beta) (weighted least squares: s^2 (X'WX)^-1, s^2 the weighted residual variance)."""

    alpha_s: float
    beta_s_per_byte: float
    cov: tuple[tuple[float, float], tuple[float, float]]
    residuals: tuple[float, ...]
    """measured - fitted seconds, one per timing, in the order given."""
    samples: int
    bound: str = ""
    """The parameter held at 0 when the free fit made it negative ("alpha" or "beta"), else ""."""

    @property
    def busbw(self) -> float:
        """The fitted bus bandwidth, bytes/s (1 / beta)."""
        return 1.0 / self.beta_s_per_byte if self.beta_s_per_byte > 0 else math.inf

    def time_s(self, op: str, size_bytes: float, n: int) -> float:
        return self.alpha_s * latency_steps(
            op, n, size_bytes
        ) + self.beta_s_per_byte * size_bytes * bus_factor(n, op)

    def sigma_s(self, x_alpha: float, x_beta: float) -> float:
        """Standard error of alpha x_alpha + beta x_beta from the fit's covariance."""
        (a, b), (_, d) = self.cov
        return math.sqrt(max(0.0, a * x_alpha**2 + 2 * b * x_alpha * x_beta + d * x_beta**2))


def fit_alpha_beta(timings: Sequence[Timing], relative: bool = True) -> AlphaBeta:
    """Least squares of seconds on (latency steps, wire bytes). relative: each timing weighted by
    1/t^2, for timings that span decades (a probe over message sizes: unweighted, the large
    messages would decide alpha too); else unweighted, for a series' per-step totals, where what
    matters is seconds of step time. Needs timings at two settings at least that are not
    proportional (e.g. two message sizes); raises otherwise."""
    return fit_rows([(*t.regressors(), t.seconds) for t in timings], relative)


def fit_rows(raw: Sequence[tuple[float, float, float]], relative: bool = True) -> AlphaBeta:
    """fit_alpha_beta on (latency steps, wire bytes, seconds) rows already made (e.g. one level
    of a two-level fabric, pipeline/measure/fabric.py)."""
    rows = [r for r in raw if r[0] > 0 or r[1] > 0]  # one rank: nothing to fit
    if any(not (math.isfinite(s) and s > 0) for *_, s in rows):
        raise ValueError("every timing must be a finite number of seconds > 0")
    w = [1.0 / (t * t) if relative else 1.0 for *_, t in rows]
    saa = sum(wi * a * a for wi, (a, _, _) in zip(w, rows, strict=True))
    sab = sum(wi * a * b for wi, (a, b, _) in zip(w, rows, strict=True))
    sbb = sum(wi * b * b for wi, (_, b, _) in zip(w, rows, strict=True))
    det = saa * sbb - sab * sab
    if len(rows) < 2 or det <= 1e-9 * saa * sbb:
        raise ValueError(
            "alpha and beta cannot be told apart: time collectives at two sizes or rank counts at least"
        )
    sat = sum(wi * a * t for wi, (a, _, t) in zip(w, rows, strict=True))
    sbt = sum(wi * b * t for wi, (_, b, t) in zip(w, rows, strict=True))
    alpha = (sbb * sat - sab * sbt) / det
    beta = (saa * sbt - sab * sat) / det
    if alpha < 0 or beta < 0:
        return _bounded(rows, w, sat / saa, sbt / sbb)
    res = tuple(t - alpha * a - beta * b for a, b, t in rows)
    dof = len(rows) - 2
    s2 = sum(wi * r * r for wi, r in zip(w, res, strict=True)) / dof if dof > 0 else 0.0
    cov = ((s2 * sbb / det, -s2 * sab / det), (-s2 * sab / det, s2 * saa / det))
    return AlphaBeta(alpha, beta, cov, res, len(rows))


def _bounded(rows: list[tuple[float, float, float]], w: list[float], alpha: float, beta: float) -> AlphaBeta:
    """Non-negative least squares for two parameters: when the free fit makes one negative (no
    latency, or no bandwidth cost, measurable at these sizes), the better of the two fits with
    one parameter held at 0 (alpha only, beta only), by weighted residual sum of squares."""
    fits = []
    for a_, b_, bound, col in ((alpha, 0.0, "beta", 0), (0.0, beta, "alpha", 1)):
        res = tuple(t - a_ * x - b_ * y for x, y, t in rows)
        rss = sum(wi * r * r for wi, r in zip(w, res, strict=True))
        sxx = sum(wi * r[col] ** 2 for wi, r in zip(w, rows, strict=True))
        var = rss / max(1, len(rows) - 1) / sxx
        cov = ((var, 0.0), (0.0, 0.0)) if col == 0 else ((0.0, 0.0), (0.0, var))
        fits.append((rss, AlphaBeta(a_, b_, cov, res, len(rows), bound)))
    return min(fits, key=lambda f: f[0])[1]


def bucketed(collectives: Sequence[Collective], bucket_bytes: float) -> list[tuple[Collective, int]]:
    """Each collective as the messages DeepSpeed sends: (one bucket-sized message, how many)."""
    if not bucket_bytes > 0:
        raise ValueError(f"bucket size must be > 0 bytes, got {bucket_bytes!r}")
    out = []
    for c in collectives:
        count = max(1, math.ceil(c.size_bytes / bucket_bytes))
        out.append((Collective(c.op, c.size_bytes / count, c.phase), count))
    return out


MEMORY_OPT_ALLREDUCE_SIZE = 500_000_000
"""ZeRO-0's all-reduce bucket in elements: `MEMORY_OPT_ALLREDUCE_SIZE` of deepspeed/runtime/engine.py,
the bucket_size `allreduce_gradients` hands `buffered_allreduce_fallback` (no config setting)."""
ZERO_DEFAULTS: dict[str, Any] = {
    "reduce_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "use_multi_rank_bucket_allreduce": True,
}
"""DeepSpeed 0.19's defaults where the config leaves them out (deepspeed/runtime/zero/config.py:
reduce_bucket_size = Field(pp_int(5e8)), prefetch_bucket_size = Field(pp_int(5e7), alias
"stage3_prefetch_bucket_size"), use_multi_rank_bucket_allreduce = True), in elements."""


def comm_elem_bytes(ds_config: Mapping[str, Any]) -> tuple[int, int]:
    """(parameter, gradient) bytes per element DeepSpeed communicates: 2 with bf16 or fp16 on,
    else 4 (the engine's parameters); gradients in `communication_data_type` when set, else the
    same (engine.py `communication_data_type`: fp16, bf16, else fp32)."""
    on = [p for p in PRECISIONS if p != "fp32" and ds_config.get(p, {}).get("enabled")]
    param = weight_bytes(on[0] if on else "fp32")
    kind = str(ds_config.get("communication_data_type") or "").lower()
    grads = weight_bytes(kind) if kind in PRECISIONS else param
    return param, grads


def bucket_messages(
    stage: int,
    zero: Mapping[str, Any],
    trainable_params: int,
    param_elem_bytes: int,
    grad_elem_bytes: int,
    params: int | None = None,
) -> tuple[Collective, ...]:
    """The messages of one ZeRO step at their real sizes, one per (op, size), in bytes: a bucket
    of `zero` (the config's zero_optimization; ZERO_DEFAULTS where absent), never larger than
    what it carries (a model under the bucket goes whole). `params`: all parameters, frozen
    ones too (ZeRO-3 gathers them; default the trainable ones). DeepSpeed 0.19, counted over
    gloo (tests/integration/test_scaling_deepspeed.py):
    0: all-reduce of MEMORY_OPT_ALLREDUCE_SIZE buckets; 1, 2: all-reduce (reduce with
    use_multi_rank_bucket_allreduce off) of reduce_bucket_size buckets, then one all-gather of the
    whole flat parameter partition (allgather_bucket_size is unused when torch has
    all_gather_into_tensor: runtime/utils.py `all_gather_dp_groups`); 3: reduce-scatter of
    reduce_bucket_size buckets, all-gathers of stage3_prefetch_bucket_size (0: one module at a
    time, not known from a count: absent). Buckets hold whole parameters: a real one is up to a
    parameter smaller than the cap, or one parameter larger than it."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO stage must be one of {STAGES}, got {stage!r}")
    if not (isinstance(trainable_params, int) and trainable_params >= 0):
        raise ValueError(f"trainable parameters must be an integer >= 0, got {trainable_params!r}")
    z = {**ZERO_DEFAULTS, **zero}
    total = trainable_params if params is None else params
    grads = partial(_message, elems=trainable_params, elem_bytes=grad_elem_bytes)
    out: list[Collective | None]
    if stage == 0:
        out = [grads("all_reduce", MEMORY_OPT_ALLREDUCE_SIZE, "backward")]
    elif stage in (1, 2):
        op = "all_reduce" if z["use_multi_rank_bucket_allreduce"] else "reduce"
        whole = trainable_params * param_elem_bytes
        out = [grads(op, z["reduce_bucket_size"], "backward"), Collective("all_gather", whole, "after step")]
    else:
        prefetch = int(z["stage3_prefetch_bucket_size"])
        gather = _message("all_gather", prefetch, "forward", total, param_elem_bytes) if prefetch else None
        out = [gather, grads("reduce_scatter", z["reduce_bucket_size"], "backward")]
    return tuple(c for c in out if c is not None and c.size_bytes > 0)


def _message(op: str, bucket: int, phase: str, elems: int, elem_bytes: int) -> Collective:
    if not int(bucket) > 0:
        raise ValueError(f"a bucket size must be > 0 elements, got {bucket!r}")
    return Collective(op, min(int(bucket), elems) * elem_bytes, phase)


@dataclass(frozen=True)
class StepModel:
    """step time(N) = compute + exposed x comm(N): compute per step per rank (constant in N under
    data parallelism with a fixed micro-batch per rank), comm(N) the alpha-beta time of the ZeRO
    stage's collectives at N ranks, `exposed` the fraction of it not hidden behind compute
    (measured at the series' sizes; 1 = no overlap)."""

    compute_s: float
    collectives: tuple[Collective, ...]
    fit: AlphaBeta
    exposed: float = 1.0
    bucket_bytes: float = DEFAULT_BUCKET_BYTES

    def _terms(self, n: int) -> tuple[float, float]:
        xa = sum(
            k * latency_steps(c.op, n, c.size_bytes) for c, k in bucketed(self.collectives, self.bucket_bytes)
        )
        xb = wire_bytes_per_rank(self.collectives, n)
        return xa, xb

    def comm_s(self, n: int) -> float:
        xa, xb = self._terms(n)
        return self.fit.alpha_s * xa + self.fit.beta_s_per_byte * xb

    def step_s(self, n: int) -> float:
        return self.compute_s + self.exposed * self.comm_s(n)

    def band_s(self, n: int, sigmas: float = 2.0) -> tuple[float, float]:
        """step_s(n) -/+ `sigmas` standard errors from the fit's covariance."""
        half = sigmas * self.exposed * self.fit.sigma_s(*self._terms(n))
        return max(self.compute_s, self.step_s(n) - half), self.step_s(n) + half

    def efficiency(self, n: int) -> float:
        """Scaling efficiency at n: compute / step time, the fraction of linear scaling from one
        GPU that is kept (1 when no communication is exposed)."""
        return self.compute_s / self.step_s(n)

    def compute(self, n: int) -> float:
        return self.compute_s

    def exposed_s(self, n: int) -> float:
        return self.exposed * self.comm_s(n)


ONE_SIZE_LABEL = "scaling measured at 1 size"
ONE_SIZE_FACTOR = 2.0
"""A candidate measured at one size: its communication at the target is modelled with that size's
bandwidth; the band spans bus bandwidth / 2 to x 2 (a convention, not a measurement)."""


def one_size_band(model: Any, n: int) -> tuple[float, float]:
    """The wider band of a candidate measured at one size: comm x 1/2 to comm x 2 (model: a
    StepModel or a fabric.FabricModel)."""
    comm = model.exposed_s(n)
    return model.compute(n) + comm / ONE_SIZE_FACTOR, model.compute(n) + comm * ONE_SIZE_FACTOR


def crossover(a: Any, b: Any, lo: int, hi: int, a_weight: float = 1.0, b_weight: float = 1.0) -> int | None:
    """The smallest rank count in (lo, hi] where the better of a and b is not the better at lo,
    comparing weight x step time (weight: price per GPU-hour for cost, 1 for time); None if it
    never changes. Checks every power of two, then bisects the first interval that flips."""
    if lo < 1 or hi < lo:
        raise ValueError(f"need 1 <= lo <= hi, got {lo}, {hi}")

    def a_wins(n: int) -> bool:
        return a_weight * a.step_s(n) < b_weight * b.step_s(n)

    first = a_wins(lo)
    prev, n = lo, 1
    while n < hi:
        n = min(hi, n * 2)
        if n > prev and a_wins(n) != first:
            left, right = prev, n  # a_wins(left) == first, a_wins(right) != first
            while right - left > 1:
                mid = (left + right) // 2
                left, right = (mid, right) if a_wins(mid) == first else (left, mid)
            return right
        prev = max(prev, n)
    return None
