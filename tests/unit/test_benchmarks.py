"""Every benchmark still imports against the current code (they run by hand, not in CI, so a
renamed module would otherwise go unnoticed until someone measures)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("path", sorted(BENCH.glob("bench_*.py")), ids=lambda p: p.stem)
def test_benchmark_imports(path: Path) -> None:
    """Imported as `python -m benchmarks.NAME` runs it: module level only (each runs its
    measurement under __main__), with no sys.path edit of its own."""
    module = importlib.import_module(f"benchmarks.{path.stem}")
    assert callable(getattr(module, "main", None))
    assert "sys.path" not in path.read_text(), f"{path.name} edits sys.path"
