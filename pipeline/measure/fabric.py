"""Step time at N ranks on two levels of fabric, with overlap and compute measured per size
(docs/design.md, "Projection"). Pure; standard library only.

- **Two levels**: ranks of one node talk over its intra-node links (NVLink / NVSwitch; here
  loopback TCP), nodes over their network (all the node's NICs). A collective on n ranks of
  g per node (m = ceil(n / g) nodes) is the hierarchical one (NCCL's rings and trees cross each
  node's boundary once per channel, one channel per NIC): all-reduce = intra-node
  reduce-scatter, an inter-node all-reduce of S / g per rank (2(m-1)/m x S a node on its
  network), intra-node all-gather; all-gather and reduce-scatter = an inter-node one ((m-1)/m x
  S a node) and an intra-node one ((g-1)/g x S a rank). Each level has its own alpha (per step)
  and beta (per byte: a rank's intra-node link, a node's network); n <= g is one level.
- **Overlap**: each collective class's exposed share (the time the step lost in it over the
  time its messages take alone), measured at the measured sizes; at N the same share is hidden
  while the compute the step can hide behind (the backward pass) holds it: exposed(N) =
  comm(N) - min(sum (1 - share) x comm_class(N), window). Past the window the bound is stated.
- **Compute per size**: every measured size keeps its own compute; a series whose compute per
  rank changes across sizes beyond its measured noise is refused (`compute_change`), never
  absorbed into the communication fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.measure.comm import bus_factor
from pipeline.measure.scaling import TREE_BELOW_BYTES, AlphaBeta, Collective, Timing, fit_rows, latency_steps


@dataclass(frozen=True)
class NodeSheet:
    """A node's fabric as its datasheet states it: used where nothing was measured, said so."""

    gpus_per_node: int
    nics_per_node: int
    nic_gbps: float  # Gb/s per NIC, one direction
    nvlink_gbs: float  # GB/s per GPU, one direction
    source: str

    @property
    def network_bytes_s(self) -> float:
        """The node's network, bytes/s: every NIC at its line rate."""
        return self.nics_per_node * self.nic_gbps * 1e9 / 8


DATASHEETS = {
    "h100": NodeSheet(8, 8, 400.0, 450.0, "NVIDIA DGX H100: 8 GPUs on NVSwitch (NVLink 4, 900 GB/s per GPU, 450 each way), 8 x 400 Gb/s ConnectX-7"),
    "h200": NodeSheet(8, 8, 400.0, 450.0, "NVIDIA HGX H200: NVLink 4 (900 GB/s per GPU, 450 each way), 8 x 400 Gb/s"),
    "a100": NodeSheet(8, 8, 200.0, 300.0, "NVIDIA DGX A100: NVLink 3 (600 GB/s per GPU, 300 each way), 8 x 200 Gb/s HDR"),
    "b200": NodeSheet(8, 8, 400.0, 900.0, "NVIDIA DGX B200: NVLink 5 (1.8 TB/s per GPU, 900 each way), 8 x 400 Gb/s"),
}  # fmt: skip
ASSUMED_ALPHA_S = {"intra": 5e-6, "inter": 10e-6}
"""Latency per step where none was measured: the order of NCCL's tuner constants (a few
microseconds a hop on NVLink, about ten across a network); an assumption, stated as one."""


def level_terms(op: str, size: float, n: int, g: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((intra steps, intra bytes a rank), (inter steps, inter bytes a node)) of one collective of
    nccl-tests size `size` on n ranks, g a node (g <= 0 or n <= g: one level, flat ring/tree)."""
    if g <= 0 or n <= g:
        return (latency_steps(op, n, size), size * bus_factor(n, op)), (0.0, 0.0)
    m = math.ceil(n / g)
    bus_factor(n, op)  # validates
    if op == "all_reduce":
        inter_steps = 2 * math.ceil(math.log2(m)) if size / g < TREE_BELOW_BYTES else 2 * (m - 1)
        return (2 * (g - 1), 2 * (g - 1) / g * size), (inter_steps, 2 * (m - 1) / m * size)
    if op in ("all_gather", "reduce_scatter"):
        return (g - 1, (g - 1) / g * size), (m - 1, (m - 1) / m * size)
    return (math.ceil(math.log2(g)) if g > 1 else 0, size), (math.ceil(math.log2(m)), size)


@dataclass(frozen=True)
class TwoLevel:
    """Alpha-beta of each level; `inter` None with g <= 0: one level for every size."""

    intra: AlphaBeta
    inter: AlphaBeta | None
    gpus_per_node: int
    notes: tuple[str, ...] = ()

    def _g(self) -> int:
        return self.gpus_per_node if self.inter is not None else 0

    def terms(self, op: str, size: float, n: int) -> tuple[tuple[float, float], tuple[float, float]]:
        return level_terms(op, size, n, self._g())

    def time_s(self, op: str, size: float, n: int) -> float:
        (ai, bi), (ae, be) = self.terms(op, size, n)
        t = self.intra.alpha_s * ai + self.intra.beta_s_per_byte * bi
        if self.inter is not None:
            t += self.inter.alpha_s * ae + self.inter.beta_s_per_byte * be
        return t


def _beta_only(rows: Sequence[tuple[float, float, float]]) -> AlphaBeta:
    """alpha 0, beta = seconds / bytes: a level whose samples cannot tell alpha from beta."""
    wire = sum(b for _, b, _ in rows)
    if not wire > 0:
        raise ValueError("no bytes were timed at this level")
    beta = sum(t for *_, t in rows) / wire
    return AlphaBeta(
        0.0, beta, ((0.0, 0.0), (0.0, 0.0)), tuple(t - beta * b for _, b, t in rows), len(rows), "alpha"
    )


def _fit(rows: list[tuple[float, float, float]], relative: bool, what: str, notes: list[str]) -> AlphaBeta:
    try:
        return fit_rows(rows, relative)
    except ValueError:
        notes.append(f"{what}: alpha and beta not separable at the measured sizes; alpha held at 0")
        return _beta_only(rows)


def fit_two_level(timings: Sequence[Timing], gpus_per_node: int, relative: bool = False) -> TwoLevel:
    """Intra-node alpha/beta from the timings of one node (n <= g), inter-node from the others'
    seconds less their intra-node phases; one level when no timing spans nodes (or none is
    within one). Raises ValueError when nothing can be fitted."""
    notes: list[str] = []
    inside = [t for t in timings if gpus_per_node <= 0 or t.n <= gpus_per_node]
    across = [t for t in timings if t not in inside]
    if not inside or not across:
        rows = [(*t.regressors(), t.seconds) for t in timings]
        if across:
            notes.append("no single-node point: one alpha/beta over intra- and inter-node links")
        return TwoLevel(_fit(rows, relative, "one level", notes), None, 0, tuple(notes))

    def scaled(t: Timing) -> tuple[tuple[float, float], tuple[float, float]]:
        out = [0.0, 0.0, 0.0, 0.0]
        for size, k in t.sizes():
            (ai, bi), (ae, be) = level_terms(t.op, size, t.n, gpus_per_node)
            out = [o + k * v for o, v in zip(out, (ai, bi, ae, be), strict=True)]
        scale = t.size_bytes / sum(size * k for size, k in t.sizes())  # the bytes as timed
        return (out[0], out[1] * scale), (out[2], out[3] * scale)

    intra = _fit([(*scaled(t)[0], t.seconds) for t in inside], relative, "intra-node", notes)
    rows = []
    for t in across:
        (ai, bi), (ae, be) = scaled(t)
        rest = t.seconds - intra.alpha_s * ai - intra.beta_s_per_byte * bi
        rows.append((ae, be, max(rest, 1e-9 * t.seconds)))
    inter = _fit(rows, relative, "inter-node", notes)
    return TwoLevel(intra, inter, gpus_per_node, tuple(notes))


SHEET_EFFICIENCY = 0.8
"""The share of a datasheet's line rate a collective's bus bandwidth reaches (nccl-tests on
NVSwitch and on InfiniBand plateau at 75-90% of it): an assumption, its range 0.5-1 in a band."""


def sheet_levels(
    sheet: NodeSheet,
    intra_eff: float = SHEET_EFFICIENCY,
    inter_eff: float = SHEET_EFFICIENCY,
    alpha_x: float = 1.0,
) -> TwoLevel:
    """The datasheet's levels at a share of their line rates, with the assumed latencies x
    `alpha_x`; no covariance (nothing was fitted)."""
    zero = ((0.0, 0.0), (0.0, 0.0))
    intra = AlphaBeta(
        ASSUMED_ALPHA_S["intra"] * alpha_x, 1 / (sheet.nvlink_gbs * 1e9 * intra_eff), zero, (), 0
    )
    inter = AlphaBeta(
        ASSUMED_ALPHA_S["inter"] * alpha_x, 1 / (sheet.network_bytes_s * inter_eff), zero, (), 0
    )
    return TwoLevel(intra, inter, sheet.gpus_per_node)


@dataclass(frozen=True)
class Exposure:
    """Communication at one size: all of it, what the step lost, what hiding the measured share
    would take, and what the window (backward) holds."""

    comm_s: float
    exposed_s: float
    hide_wanted_s: float
    window_s: float

    @property
    def capped(self) -> bool:
        """More overlap needed than the window can hide: exposed is past the measured share."""
        return self.hide_wanted_s > self.window_s


def exposure(by_op: Mapping[str, float], shares: Mapping[str, float], window_s: float) -> Exposure:
    """The exposed communication: each class hides (1 - its exposed share) of its time, all of
    them together at most `window_s` (share 1 where a class's share was not measured)."""
    comm = sum(by_op.values())
    wanted = sum((1 - min(1.0, max(0.0, shares.get(op, 1.0)))) * t for op, t in by_op.items())
    return Exposure(comm, comm - min(wanted, window_s), wanted, window_s)


BACKWARD_SHARE = 2 / 3
"""The backward pass's share of a step's compute (its FLOPs are twice the forward's, Kaplan et
al. 2020): the window a gradient collective can hide behind, an assumption stated as one."""


@dataclass(frozen=True)
class FabricModel:
    """step time(N) = compute(N) + exposed communication(N). compute(N): the size's own where it
    was measured (`compute_at`), else `compute_s` (constant in N: data parallelism with a fixed
    micro-batch per rank); the messages are (size class, how many) per step, their sizes not
    depending on N (all-gather's is the whole output)."""

    compute_s: float
    messages: tuple[tuple[Collective, int], ...]
    links: TwoLevel
    shares: tuple[tuple[str, float], ...] = ()
    window_s: float = math.inf
    compute_at: tuple[tuple[int, float], ...] = ()

    def compute(self, n: int) -> float:
        return dict(self.compute_at).get(n, self.compute_s)

    def comm_by_op(self, n: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for c, k in self.messages:
            out[c.op] = out.get(c.op, 0.0) + k * self.links.time_s(c.op, c.size_bytes, n)
        return out

    def comm_s(self, n: int) -> float:
        return sum(self.comm_by_op(n).values())

    def exposure(self, n: int) -> Exposure:
        return exposure(self.comm_by_op(n), dict(self.shares), self.window_s)

    def exposed_s(self, n: int) -> float:
        return self.exposure(n).exposed_s

    def step_s(self, n: int) -> float:
        return self.compute(n) + self.exposed_s(n)

    def _sigma(self, n: int) -> float:
        sums = [[0.0, 0.0], [0.0, 0.0]]
        for c, k in self.messages:
            for lvl, (a, b) in enumerate(self.links.terms(c.op, c.size_bytes, n)):
                sums[lvl][0] += k * a
                sums[lvl][1] += k * b
        var = self.links.intra.sigma_s(*sums[0]) ** 2
        if self.links.inter is not None:
            var += self.links.inter.sigma_s(*sums[1]) ** 2
        return math.sqrt(var)

    def band_s(self, n: int, sigmas: float = 2.0) -> tuple[float, float]:
        """step_s(n) -/+ `sigmas` standard errors of the fits (both levels), scaled by the exposed
        share of the communication."""
        e = self.exposure(n)
        half = sigmas * self._sigma(n) * (e.exposed_s / e.comm_s if e.comm_s > 0 else 1.0)
        return max(self.compute(n), self.step_s(n) - half), self.step_s(n) + half

    def efficiency(self, n: int) -> float:
        return self.compute(n) / self.step_s(n)


def compute_change(
    points: Sequence[tuple[int, float, float | None]], sigmas: float = 2.0, assumed_noise: float = 0.10
) -> str | None:
    """A sentence when compute per rank changes between measured sizes beyond their noise, else
    None. points: (GPUs, compute seconds, relative noise of one step: its step time's coefficient
    of variation, None when not measured: `assumed_noise` then, stated)."""
    pts = sorted(points)
    for (ga, ca, na), (gb, cb, nb) in zip(pts, pts[1:], strict=False):
        if ca <= 0:
            continue
        noise = sigmas * math.hypot(assumed_noise if na is None else na, assumed_noise if nb is None else nb)
        change = (cb - ca) / ca
        if abs(change) > noise:
            how = (
                "measured"
                if na is not None and nb is not None
                else f"{assumed_noise:.0%} assumed where not measured"
            )
            return (
                f"compute per rank changed from {ca:.4g} s at {ga} GPUs to {cb:.4g} s at {gb} GPUs ({change:+.0%}), "
                f"beyond the noise (+/-{noise:.0%}: {sigmas:g} x the step time's spread, {how})"
            )
    return None


@dataclass(frozen=True)
class Band:
    """A projected step time with its band: each input varied alone over its range, the changes
    combined by root sum of squares (GUM, JCGM 100:2008, 5.1); `dominant` the largest share."""

    mid: float
    low: float
    high: float
    shares: dict[str, float] = field(default_factory=dict)

    @property
    def dominant(self) -> str:
        return max(self.shares, key=lambda k: self.shares[k]) if self.shares else "none"


def band(
    model: Callable[[Mapping[str, float]], float],
    centre: Mapping[str, float],
    ranges: Mapping[str, tuple[float, float]],
) -> Band:
    """`model(inputs)` at `centre`, and with each input at either end of its range alone."""
    mid = model(centre)
    down = up = 0.0
    squares: dict[str, float] = {}
    for name, ends in ranges.items():
        values = [model({**centre, name: v}) - mid for v in ends]
        down += min(0.0, *values) ** 2
        up += max(0.0, *values) ** 2
        squares[name] = max(abs(v) for v in values) ** 2
    total = sum(squares.values())
    return Band(
        mid,
        mid - math.sqrt(down),
        mid + math.sqrt(up),
        {k: v / total for k, v in squares.items()} if total else {},
    )


POINT_RANGES = {
    "intra-node bandwidth": (0.5, 1.0),
    "inter-node bandwidth": (0.5, 1.0),
    "latency": (0.5, 2.0),
    "exposed share": (0.0, 1.0),
}
"""The band of a projection from one measured point and a datasheet: each level's share of its
line rate, the assumed latencies x 1/2 to x 2, and the exposed share from all hidden to none."""


def project_from_point(
    step_s: float,
    n0: int,
    n: int,
    messages: Sequence[tuple[Collective, int]],
    sheet: NodeSheet,
    exposed_share: float,
    microbatches: int = 1,
) -> Band:
    """Step time at n GPUs from one measured step time at n0 (weak scaling: the work per GPU
    fixed), the step's messages and the node's datasheet: compute = the step less its exposed
    communication at n0 (the model's), then compute + exposed(n). The window the step can hide
    communication behind: the backward pass of one micro-batch (gradient accumulation overlaps
    only the last one's). `exposed_share`: each class's share not hidden (assumed for a
    published point; measured for a candidate's)."""

    def model(x: Mapping[str, float]) -> float:
        links = sheet_levels(sheet, x["intra-node bandwidth"], x["inter-node bandwidth"], x["latency"])
        ops = {c.op for c, _ in messages}
        shares = tuple((op, x["exposed share"]) for op in ops)
        plain = FabricModel(0.0, tuple(messages), links)
        window = BACKWARD_SHARE * max(0.0, step_s - plain.comm_s(n0)) / max(1, microbatches)
        fm = FabricModel(0.0, tuple(messages), links, shares, window)
        return step_s - fm.exposed_s(n0) + fm.exposed_s(n)

    centre = {
        "intra-node bandwidth": SHEET_EFFICIENCY,
        "inter-node bandwidth": SHEET_EFFICIENCY,
        "latency": 1.0,
        "exposed share": exposed_share,
    }
    return band(model, centre, POINT_RANGES)
