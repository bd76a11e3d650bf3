"""Start-up per partition and node (docs/design.md, "Start-up"): each job tags every node's
import and model-build seconds (`sq.startup.<node>`, the node's slowest rank); the report
shows each node's median over the sweep's runs next to its partition's median over its nodes,
and names a node whose imports take SLOW_FACTOR times that median or more (a slow shared file
system shows first as a slow `import torch`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from analysis import plots
from analysis.runs import RunRecord, parse_float
from pipeline.tracking import keys as K

SLOW_FACTOR = 3.0


def parse_node_tag(value: str) -> dict[str, float]:
    """'import_s=1.234 model_build_s=0.056' -> {"import_s": 1.234, ...}; unreadable parts dropped."""
    out = {}
    for part in value.split():
        name, _, text = part.partition("=")
        number = parse_float(text)
        if number is not None:
            out[name] = number
    return out


def node_figures(runs: Sequence[RunRecord]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """partition -> node -> phase -> the values of every run that ran there."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for run in runs:
        for key, value in run.tags.items():
            if key.startswith(K.TAG_STARTUP_NODE_PREFIX):
                node = out.setdefault(run.partition, {}).setdefault(key[len(K.TAG_STARTUP_NODE_PREFIX) :], {})
                for phase, seconds in parse_node_tag(value).items():
                    node.setdefault(phase, []).append(seconds)
    return out


def slow_nodes(imports: dict[str, float], factor: float = SLOW_FACTOR) -> list[str]:
    """The nodes whose import takes `factor` times the median over the partition's nodes, or more."""
    if not imports:
        return []
    median = statistics.median(imports.values())
    return sorted(n for n, s in imports.items() if median > 0 and s >= factor * median)


def startup_table(runs: Sequence[RunRecord]) -> plots.Table:
    header = [
        "partition",
        "node",
        "import s",
        "model build s",
        "partition median import s",
        "runs",
        "verdict",
    ]
    body = []
    for partition, nodes in sorted(node_figures(runs).items()):
        imports = {n: statistics.median(p["import_s"]) for n, p in nodes.items() if p.get("import_s")}
        median = statistics.median(imports.values()) if imports else None
        slow = set(slow_nodes(imports))
        for node, phases in sorted(nodes.items()):
            build = phases.get("model_build_s")
            body.append([
                partition, node, _s(imports.get(node)), _s(statistics.median(build) if build else None),
                _s(median), str(max(len(v) for v in phases.values())),
                f"slow imports (>= {SLOW_FACTOR:g}x the partition's median)" if node in slow else "ok",
            ])  # fmt: skip
    return plots.Table(header, body)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


NOTE = (
    "Each node's median over the sweep's runs of its slowest rank's import (process start to torch and "
    "DeepSpeed imported) and model build; the reference is the partition's median over its nodes. A slow "
    "shared file system shows first as a slow import."
)


def startup_blocks(runs: Sequence[RunRecord]) -> list[plots.Block]:
    """The report's "Start-up per partition and node" section."""
    table = startup_table(runs)
    if not table.rows:
        return ["No run recorded its nodes' start-up (the sq.startup.* tags)."]
    return [table, NOTE]
