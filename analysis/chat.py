"""The report's chat-data part (docs/data.md, "Chat and instruction data"): padding against
packing per partition (the same candidate but for data.packing), in loss-bearing tokens/s,
padding efficiency and cost, and the length distribution of the chat set as a plot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from analysis import plots
from analysis.runs import RunRecord
from analysis.table import Row
from pipeline.measure.kinds import PACKINGS
from pipeline.tracking import keys as K

LENGTH_PARAMS = ("p50", "p95", "max")
PACKING_NOTE = (
    "Padding vs packing: the candidates of a sweep that differ only in data.packing, side by side. Loss-bearing "
    "tokens/s = the step's tokens that carry the loss (assistant tokens after masking) / median step time. Padding "
    "efficiency = real tokens / positions computed. USD per million loss-bearing tokens = 10^6 / (tokens per USD "
    "x loss-bearing tokens / positions): what training on the answers costs, padding paid for. Packed / padded: "
    "the ratio of those costs (below 1: packing is cheaper). Cost per verified checkpoint is the report's "
    "cost per accepted output."
)


def _base(candidate: str) -> tuple[str, str] | None:
    """(the candidate without its packing, the packing) for a chat candidate (…-chat-pad|pack)."""
    for packing in PACKINGS:
        if candidate.endswith(f"-{packing}"):
            return candidate.removesuffix(f"-{packing}"), packing
    return None


def usd_per_million_loss_tokens(r: Row) -> float | None:
    loss, positions = r.value(K.DATA_LOSS_TOKENS_PER_S), r.value(K.PERF_TOKENS_PER_S)
    if not (r.tokens_per_usd and loss and positions):
        return None
    return 1e6 / (r.tokens_per_usd * loss / positions)


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def packing_table(rows: Sequence[Row]) -> plots.Table | None:
    pairs: dict[str, dict[str, Row]] = {}
    for r in rows:
        if r.value(K.DATA_LOSS_TOKENS_PER_S) is not None and (b := _base(r.candidate)):
            pairs.setdefault(b[0], {})[b[1]] = r
    body = []
    for base, by in sorted(pairs.items()):
        if len(by) != 2:
            continue
        pad, pack = by["pad"], by["pack"]
        cost = {k: usd_per_million_loss_tokens(v) for k, v in by.items()}
        ratio = cost["pack"] / cost["pad"] if cost["pack"] and cost["pad"] else None
        body.append([
            pad.partition, base,
            f"{_num(pad.value(K.DATA_LOSS_TOKENS_PER_S), ',.0f')} / {_num(pack.value(K.DATA_LOSS_TOKENS_PER_S), ',.0f')}",
            f"{_num(pad.value(K.DATA_PADDING_EFFICIENCY), '.1%')} / {_num(pack.value(K.DATA_PADDING_EFFICIENCY), '.1%')}",
            _num(pack.value(K.DATA_PACK_FILL), ".1%"),
            f"{_num(cost['pad'], '.3g')} / {_num(cost['pack'], '.3g')}",
            _num(ratio, ".3f"),
            f"{_num(pad.per_checkpoint, '.3g')} / {_num(pack.per_checkpoint, '.3g')}",
        ])  # fmt: skip
    if not body:
        return None
    header = [
        "partition", "candidate", "loss-bearing tok/s pad / pack", "padding efficiency pad / pack", "pack fill",
        "USD per M loss tokens pad / pack", "packed / padded cost", "USD per verified checkpoint pad / pack",
    ]  # fmt: skip
    return plots.Table(header, body)


def length_plot(runs: Sequence[RunRecord]) -> plots.Plot | None:
    """p50 / p95 / max of prompt and answer lengths (tokens) of each chat set of the sweep."""
    sets: dict[str, dict[str, float]] = {}
    for run in runs:
        values = {
            f"{part}_{q}": v
            for part in ("prompt", "answer")
            for q in LENGTH_PARAMS
            if (v := run.param_float(f"{K.PARAM_DATA_LENGTHS}{part}_{q}")) is not None
        }
        if values:
            sets.setdefault(run.params.get("data.path", "?"), values)
    if not sets:
        return None
    fig = Figure(figsize=(9, 1.8 + 1.6 * len(sets)), layout="constrained")
    axes: Any = fig.subplots(len(sets), 1, squeeze=False)
    for ax, (path, values) in zip(axes[:, 0], sorted(sets.items()), strict=True):
        for i, part in enumerate(("prompt", "answer")):
            ys = [values.get(f"{part}_{q}", 0.0) for q in LENGTH_PARAMS]
            xs = [j + (i - 0.5) * 0.4 for j in range(len(LENGTH_PARAMS))]
            bars = ax.bar(xs, ys, width=0.4, label=part)
            ax.bar_label(bars, labels=[f"{y:.0f}" for y in ys], fontsize=8)
        ax.set_xticks(range(len(LENGTH_PARAMS)), list(LENGTH_PARAMS))
        ax.set_ylabel("tokens")
        ax.set_title(path, fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle("Chat set lengths: prompt and answer (trained tokens), before the seq_len fit")
    return plots.Plot("chat_lengths", "Chat set lengths", plots._png(fig))


def chat_sections(runs: Sequence[RunRecord], rows: Sequence[Row]) -> list[plots.Section]:
    """The chat part of the report; none for a sweep without chat data."""
    table, plot = packing_table(rows), length_plot(runs)
    blocks: list[Any] = [*([table, PACKING_NOTE] if table else []), *([plot] if plot else [])]
    return [plots.Section("Chat data: padding vs packing, lengths", blocks)] if blocks else []
