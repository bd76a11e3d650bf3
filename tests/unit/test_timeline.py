"""The timeline's marks are named once (pipeline.measure.timeline.Mark): no module sets or reads
a mark by a string of its own, and a timeline written with the old string keys reads the same."""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline.contract.records import StopRecord
from pipeline.job.derived import breakdown
from pipeline.measure.timeline import Mark

REPO = Path(__file__).resolve().parents[2]


def _string_keys(tree: ast.AST) -> list[str]:
    """`x.timeline["..."]`, `x.timeline.get("...")` and `"..." in x.timeline` with a literal."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target = node.value
            key = node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            target = node.func.value
            key = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and node.comparators:
            target = node.comparators[0]
            key = node.left.value
        else:
            continue
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "timeline" and isinstance(key, str):
            out.append(f"{ast.unparse(node)} (line {node.lineno})")
    return out


def test_no_module_names_a_mark_by_a_string() -> None:
    found = {
        str(p.relative_to(REPO)): keys
        for p in sorted((REPO / "pipeline").rglob("*.py"))
        if (keys := _string_keys(ast.parse(p.read_text())))
    }
    assert found == {}, found


def test_the_scan_sees_each_form() -> None:
    code = 'r.timeline["engine_ready"] = 1\nr.timeline.get("load_done")\nif "x" in r.timeline: pass\n'
    assert len(_string_keys(ast.parse(code))) == 3


def test_a_timeline_with_the_old_string_keys_reads_the_same() -> None:
    prev = StopRecord("preempt", signal_time=100.0, exit_time=101.0, stop_step=10, saved_step=10)
    old = {"engine_ready": 103.0, "load_done": 104.0, "first_step_done": 104.5}
    new = {Mark.ENGINE_READY: 103.0, Mark.LOAD_DONE: 104.0, Mark.FIRST_STEP_DONE: 104.5}
    assert breakdown(prev, 101.0, old, 10) == breakdown(prev, 101.0, new, 10)
    assert breakdown(prev, 101.0, old, 10).load_s == 1.0
