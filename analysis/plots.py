"""The report's figures (matplotlib, Agg, no pyplot state) as PNG bytes, and its pages.

Every function takes the report's rows and returns a `Plot` whose `png` is None, with a
note saying why, when no candidate has the data: a missing plot is a message, not a crash.
Candidates are bars of horizontal charts so their long names stay readable. The pages
(`write_pages`) render one document model as a self-contained HTML file and as Markdown.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from pipeline.tracking import keys as K  # noqa: E402

if TYPE_CHECKING:
    from analysis.table import Row

HEADROOM_BAND = (0.15, 0.30)
"""docs/design.md's 15-30% headroom band (pipeline.measure.memory.fit_verdict): tight inside, fits above."""
RESTART_LABELS = {
    K.RESTART_SIGNAL_TO_EXIT_S: "signal -> exit (save, teardown)",
    K.RESTART_EXIT_TO_START_S: "exit -> start (requeue, queue)",
    K.RESTART_START_TO_READY_S: "start -> ready (imports, init)",
    K.RESTART_LOAD_S: "checkpoint load",
    K.RESTART_FIRST_STEP_S: "first step",
}
GOODPUT_PARTS = ("startup_s", "ckpt_save_s", "restore_s", "lost_work_s", "drills_s", "idle_s")


@dataclass(frozen=True)
class Plot:
    name: str
    """File stem, e.g. "throughput"."""
    title: str
    png: bytes | None
    note: str = ""


def _figure(n_bars: int, ncols: int = 1) -> Figure:
    return Figure(
        figsize=(6.5 * ncols if ncols > 1 else 9, 1.8 + 0.32 * max(n_bars, 1)), layout="constrained"
    )


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return buf.getvalue()


def _bars(
    name: str, title: str, rows: Sequence[Row], get: Callable[[Row], float | None], xlabel: str, fmt: str
) -> Plot:
    have = [(r.candidate, v) for r in rows if (v := get(r)) is not None]
    if not have:
        return Plot(name, title, None, f"no candidate reports {xlabel}")
    fig = _figure(len(have))
    ax = fig.subplots()
    labels, values = zip(*have, strict=True)
    bars = ax.barh(labels, values, color="#4C72B0")
    ax.bar_label(bars, labels=[format(v, fmt) for v in values], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.margins(x=0.15)
    missing = len(rows) - len(have)
    return Plot(name, title, _png(fig), f"{missing} candidate(s) without data not shown" if missing else "")


def throughput(rows: Sequence[Row]) -> Plot:
    have = [r for r in rows if r.value(K.PERF_TOKENS_PER_S) is not None]
    if not have:
        return Plot("throughput", "Throughput and MFU", None, "no candidate reports tokens/s")
    fig = _figure(len(have), ncols=2)
    ax1, ax2 = fig.subplots(1, 2, sharey=True)
    labels = [r.candidate for r in have]
    ax1.barh(labels, [r.value(K.PERF_TOKENS_PER_S) or 0.0 for r in have], color="#4C72B0")
    ax1.invert_yaxis()
    ax1.set_xlabel("tokens/s (global, median)")
    for key, off, label, color in (
        (K.PERF_MFU, -0.2, "MFU (datasheet peak)", "#55A868"),
        (K.PERF_MFU_VS_CEILING, 0.2, "MFU vs measured ceiling", "#C44E52"),
    ):
        # a value that was not measured gets no bar (never a 0 bar) and says so
        values = [(i + off, r.value(key)) for i, r in enumerate(have)]
        shown = [(y, v) for y, v in values if v is not None]
        ax2.barh([y for y, _ in shown], [v for _, v in shown], height=0.4, label=label, color=color)
        for y, v in values:
            if v is None:
                ax2.text(0, y, " not measured", va="center", fontsize=7, color="#555555")
    ax2.set_xlabel("fraction (no bar: not measured, e.g. no datasheet peak for the device)")
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    fig.suptitle("Throughput and MFU per candidate")
    return Plot("throughput", "Throughput and MFU", _png(fig))


def cost_per_checkpoint(rows: Sequence[Row]) -> Plot:
    plot = _bars(
        "cost",
        "Cost per successful checkpoint",
        rows,
        lambda r: r.per_checkpoint,
        "USD per verified checkpoint",
        ".3g",  # CPU runs here cost fractions of a cent
    )
    undefined = [
        f"{r.candidate} ({r.why_undefined('0 verified checkpoints')})"
        for r in rows
        if r.per_checkpoint is None
    ]
    note = "not defined for: " + "; ".join(undefined) if undefined else ""
    return Plot(plot.name, plot.title, plot.png, note or plot.note)


def restart(rows: Sequence[Row]) -> Plot:
    have = [r for r in rows if r.restart_parts]
    if not have:
        return Plot("restart", "Restart time", None, "no run had a preemption drill (restart/* metrics)")
    fig = _figure(len(have))
    ax = fig.subplots()
    left = [0.0] * len(have)
    for key, label in RESTART_LABELS.items():
        widths = [r.restart_parts.get(key, 0.0) for r in have]
        ax.barh([r.candidate for r in have], widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds, signal -> first optimizer step after resume (median)")
    fig.legend(loc="outside lower center", ncols=3, fontsize=8)
    ax.set_title("Restart time after a preemption, by part")
    return Plot("restart", "Restart time", _png(fig))


def step_times(rows: Sequence[Row], note: str = "") -> Plot:
    have = [r for r in rows if r.step_times]
    if not have:
        return Plot("step_times", "Step-time distributions", None, note or "no step-time series fetched")
    fig = _figure(len(have))
    ax = fig.subplots()
    ax.boxplot(
        [r.step_times for r in have],
        orientation="horizontal",
        tick_labels=[r.candidate for r in have],
        showfliers=True,
    )
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds per optimizer step ({K.PERF_STEP_TIME_S}, warm-up excluded)")
    ax.set_title("Step-time distributions")
    return Plot("step_times", "Step-time distributions", _png(fig), note)


def memory(rows: Sequence[Row]) -> Plot:
    have = []
    for r in rows:
        peak = r.value(K.MEM_PEAK_ALLOCATED_GIB) or r.value(K.MEM_PEAK_RSS_GIB)
        cap = r.value(K.MEM_CAPACITY_GIB)
        if peak is not None and cap:
            have.append((r.candidate, peak, cap))
    if not have:
        return Plot(
            "memory", "Memory used vs capacity", None, "no candidate reports peak memory and a capacity"
        )
    fig = _figure(len(have))
    ax = fig.subplots()
    low, high = HEADROOM_BAND
    ax.axvspan(1 - high, 1 - low, color="#F2C14E", alpha=0.35, label=f"tight ({low:.0%}-{high:.0%} headroom)")
    right = max(1.05, max(p / c for _, p, c in have) + 0.05)
    ax.axvspan(1 - low, right, color="#C44E52", alpha=0.2, label=f"does not fit (< {low:.0%} headroom)")
    fracs = [p / c for _, p, c in have]
    bars = ax.barh([n for n, _, _ in have], fracs, color="#4C72B0")
    ax.bar_label(bars, labels=[f"{p:.1f}/{c:.0f} GiB" for _, p, c in have], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, right + 0.25)  # room for the GiB labels
    ax.set_xlabel("peak memory / device capacity")
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    ax.set_title("Peak memory vs capacity (median over runs)")
    return Plot("memory", "Memory used vs capacity", _png(fig))


def goodput(rows: Sequence[Row]) -> Plot:
    have = [r for r in rows if r.goodput is not None and r.goodput.allocated_s > 0]
    if not have:
        return Plot("goodput", "Goodput", None, "no candidate reports time/allocated_s and time/productive_s")
    fig = _figure(len(have))
    ax = fig.subplots()
    labels = [r.candidate for r in have]
    left = [0.0] * len(have)
    for part in ("productive_s", *GOODPUT_PARTS):
        widths = [getattr(r.goodput, part) / r.goodput.allocated_s for r in have if r.goodput]
        ax.barh(labels, widths, left=left, label=part.removesuffix("_s").replace("_", " "))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("fraction of allocated time (productive = goodput)")
    fig.legend(loc="outside lower center", ncols=4, fontsize=8)
    ax.set_title("Goodput and badput (all finished runs)")
    return Plot("goodput", "Goodput", _png(fig))


def compare(
    name: str, title: str, pairs: Sequence[tuple[str, float | None, float | None]], xlabel: str
) -> Plot:
    """Side-by-side bars of one column for two sweeps (label, value in A, value in B)."""
    have = [p for p in pairs if p[1] is not None or p[2] is not None]
    if not have:
        return Plot(name, title, None, f"neither sweep reports {xlabel}")
    fig = _figure(len(have))
    ax = fig.subplots()
    y = range(len(have))
    for col, off, label, color in ((1, -0.2, "sweep A", "#4C72B0"), (2, 0.2, "sweep B", "#DD8452")):
        values = [(i + off, p[col]) for i, p in zip(y, have, strict=True)]
        shown = [(yy, v) for yy, v in values if v is not None]  # a missing value is no bar, not 0
        ax.barh([yy for yy, _ in shown], [v for _, v in shown], height=0.4, label=label, color=color)
        for yy, v in values:
            if v is None:
                ax.text(0, yy, " not measured", va="center", fontsize=7, color="#555555")
    ax.set_yticks(list(y), [n for n, _, _ in have])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    ax.set_title(title)
    return Plot(name, title, _png(fig))


def eval_curves(rows: Sequence[Row], note: str = "") -> Plot:
    """The held-out loss against the step, one line per candidate, each with its target."""
    have = [r for r in rows if r.eval_curve]
    if not have:
        return Plot("eval_curves", "Eval loss per candidate", None, note or "no run logged eval/loss")
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(have):
        color = f"C{i % 10}"
        steps, losses = zip(*r.eval_curve, strict=True)
        ax.plot(steps, losses, marker="o", markersize=3, color=color, label=r.candidate)
        target = r.eval_curve_run.metric(K.TARGET_EVAL_LOSS) if r.eval_curve_run else None
        if target is not None:
            ax.axhline(target, color=color, linestyle="--", linewidth=0.8)
    ax.set_xlabel("optimizer step (0: before the first)")
    ax.set_ylabel("held-out loss, nats per token")
    ax.set_title("Eval loss per candidate (dashed: target)")
    fig.legend(loc="outside lower center", ncols=2, fontsize=7)
    return Plot("eval_curves", "Eval loss per candidate", _png(fig), note)


def cost_to_target(rows: Sequence[Row]) -> Plot:
    return _bars(
        "cost_to_target",
        "Cost to the target eval loss",
        rows,
        lambda r: r.value(K.TARGET_USD),
        "USD to reach the target eval loss (median of accepted runs)",
        ".3g",
    )


def data_wait(rows: Sequence[Row]) -> Plot:
    return _bars(
        "data_wait",
        "Data-wait share of step time",
        rows,
        lambda r: r.value(K.DATA_WAIT_FRAC),
        "fraction of step time waiting for batches (median)",
        ".1%",
    )


def all_plots(rows: Sequence[Row], step_note: str = "", eval_note: str = "") -> list[Plot]:
    """The data-path plots only where some run evaluated (sweeps from before data/ have none)."""
    evaluated = any(r.value(K.EVAL_FIRST_LOSS) is not None for r in rows)
    data = [cost_to_target(rows), eval_curves(rows, eval_note), data_wait(rows)] if evaluated else []
    return [
        throughput(rows),
        cost_per_checkpoint(rows),
        *data,
        restart(rows),
        step_times(rows, step_note),
        memory(rows),
        goodput(rows),
    ]


# --- pages: one document model, rendered as self-contained HTML and as Markdown ---------------


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


Block = str | list[str] | Table | Plot
"""A paragraph, a bullet list, a table or a plot."""


@dataclass(frozen=True)
class Section:
    title: str
    blocks: list[Block]


CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:100em}
table{border-collapse:collapse;font-size:13px;margin:1em 0}th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0}tr:nth-child(even){background:#fafafa}.pass{color:#1a7f37}.fail{color:#c62828}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}.note{color:#666;font-style:italic}"""
# Sets <body data-images-ok="true"> once every image decoded, and data-decision-bottom (px from the
# page's top to the end of the first section's list: the decision): headless checks read them from the DOM.
CHECK_IMAGES_JS = """window.addEventListener('load',function(){var i=Array.prototype.slice.call(document.images);
document.body.setAttribute('data-images',String(i.length));document.body.setAttribute('data-images-ok',
String(i.every(function(x){return x.complete&&x.naturalWidth>0;})));
var d=document.querySelector('h2 + ul');if(d){document.body.setAttribute('data-decision-bottom',
String(Math.round(d.getBoundingClientRect().bottom+window.scrollY)));}});"""


def _cell_html(text: str) -> str:
    e = html.escape(text)
    if text.startswith("pass"):
        return f'<span class="pass">{e}</span>'
    return f'<span class="fail">{e}</span>' if text.startswith("fail") else e


def render_html(title: str, sections: Sequence[Section]) -> str:
    """One self-contained page: inline CSS, PNGs as base64 data URIs, no external resource."""
    out = [
        "<!DOCTYPE html>",
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>',
        f"<style>{CSS}</style><script>{CHECK_IMAGES_JS}</script></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for s in sections:
        out.append(f"<h2>{html.escape(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, str):
                out.append(f"<p>{html.escape(b)}</p>")
            elif isinstance(b, list):
                out.append("<ul>" + "".join(f"<li>{_cell_html(x)}</li>" for x in b) + "</ul>")
            elif isinstance(b, Table):
                head = "".join(f"<th>{html.escape(h)}</th>" for h in b.header)
                body = "".join(
                    "<tr>" + "".join(f"<td>{_cell_html(c)}</td>" for c in r) + "</tr>" for r in b.rows
                )
                out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            elif b.png is not None:
                data = base64.b64encode(b.png).decode()
                out.append(
                    f'<h3>{html.escape(b.title)}</h3><img alt="{html.escape(b.title)}" src="data:image/png;base64,{data}">'
                )
                if b.note:
                    out.append(f'<p class="note">{html.escape(b.note)}</p>')
            else:
                out.append(
                    f'<h3>{html.escape(b.title)}</h3><p class="note">No plot: {html.escape(b.note)}</p>'
                )
    out.append("</body></html>")
    return "\n".join(out)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(title: str, sections: Sequence[Section], plot_dir: str) -> str:
    """The same page in Markdown; plots are PNG files under plot_dir (relative to the .md)."""
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, str):
                out += [b, ""]
            elif isinstance(b, list):
                out += [f"- {x}" for x in b] + [""]
            elif isinstance(b, Table):
                out.append("| " + " | ".join(_md(h) for h in b.header) + " |")
                out.append("|" + "---|" * len(b.header))
                out += ["| " + " | ".join(_md(c) for c in r) + " |" for r in b.rows] + [""]
            elif b.png is not None:
                out += [f"### {b.title}", "", f"![{b.title}]({plot_dir}/{b.name}.png)", ""]
                out += [f"_{b.note}_", ""] if b.note else []
            else:
                out += [f"### {b.title}", "", f"_No plot: {b.note}_", ""]
    return "\n".join(out)


def write_pages(out_dir: Path, stem: str, title: str, sections: Sequence[Section]) -> list[Path]:
    """<stem>.html, <stem>.md and the PNGs the Markdown links to; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_dir = out_dir / f"{stem}_plots"
    written = []
    for s in sections:
        for b in s.blocks:
            if isinstance(b, Plot) and b.png is not None:
                plot_dir.mkdir(exist_ok=True)
                (plot_dir / f"{b.name}.png").write_bytes(b.png)
    page = out_dir / f"{stem}.html"
    page.write_text(render_html(title, sections), encoding="utf-8")
    md = out_dir / f"{stem}.md"
    md.write_text(render_markdown(title, sections, plot_dir.name), encoding="utf-8")
    written += [page, md]
    if plot_dir.exists():
        written.append(plot_dir)
    return written
