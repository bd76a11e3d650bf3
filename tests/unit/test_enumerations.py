"""Enumerations are declared once (pipeline/measure/kinds.py for the values the measurements
share, pipeline/config/schema.py for the config's own) and imported everywhere else: a tuple,
list or set of string literals that are all values of one enumeration, anywhere else in
pipeline/ or analysis/, is a second declaration that will drift (the precisions, methods and
architectures were once declared three times, in three orders)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import schema
from pipeline.measure import kinds

REPO = Path(__file__).resolve().parents[2]
DECLARING = {REPO / "pipeline/measure/kinds.py", REPO / "pipeline/config/schema.py"}


def enumerations() -> dict[str, frozenset[str]]:
    """Every module-level tuple of strings named in capitals in the declaring modules."""
    out = {}
    for module in (kinds, schema):
        for name, value in vars(module).items():
            if (
                name.isupper()
                and isinstance(value, tuple)
                and value
                and all(isinstance(v, str) for v in value)
            ):
                out[f"{module.__name__}.{name}"] = frozenset(value)
    return out


# not enumerations of the config: lists of names whose values are not choices a user makes
NOT_CHOICES = {
    "pipeline.config.schema.SYSTEM_DIRS",
    "pipeline.config.schema.SYSTEM_DIRS_OPEN",
    "pipeline.config.schema.DEFAULT_SECRET_PATTERNS",  # tracking/redact.py's default, a list of patterns
}


def respellings(source: str, enums: dict[str, frozenset[str]]) -> list[tuple[int, str, tuple[Any, ...]]]:
    """(line, enumeration, literal) for each literal collection of 2+ strings that all belong
    to one enumeration."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Tuple | ast.List | ast.Set) or len(node.elts) < 2:
            continue
        if not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            continue
        values = {e.value for e in node.elts}  # type: ignore[attr-defined]
        for name, members in enums.items():
            if name not in NOT_CHOICES and values <= members:
                found.append((node.lineno, name, tuple(sorted(values))))
                break
    return found


def test_every_enumeration_is_declared_once() -> None:
    enums = enumerations()
    assert {"pipeline.measure.kinds.PRECISIONS", "pipeline.measure.kinds.METHODS"} <= set(enums)
    files = sorted(
        p for d in ("pipeline", "analysis") for p in (REPO / d).rglob("*.py") if p not in DECLARING
    )
    problems = [
        f"{path.relative_to(REPO)}:{line}: {values} spells values of {name}; import it instead"
        for path in files
        for line, name, values in respellings(path.read_text(), enums)
    ]
    assert not problems, "\n".join(problems)


def test_the_declaring_modules_do_not_declare_one_enumeration_twice() -> None:
    """schema re-exports kinds' tuples (the same objects); no other pair of names may hold the
    same set of values."""
    seen: dict[frozenset[str], str] = {}
    for module in (kinds, schema):
        for name, value in vars(module).items():
            if (
                name.isupper()
                and isinstance(value, tuple)
                and value
                and all(isinstance(v, str) for v in value)
            ):
                key = frozenset(value)
                same = seen.get(key)
                assert same is None or getattr(kinds, same, None) is value, f"{name} repeats {same}"
                seen.setdefault(key, name)


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ('PRECISIONS = ("bf16", "fp16", "fp32")', True),  # another order is the same declaration
        ('if method in ["lora", "qlora"]: pass', True),  # a subset is one too
        ('x: Literal["llama", "gpt2"]', True),
        ('if kind not in {"tokens", "text"}: pass', True),
        ('pair = ("local", "launcher.kind=local")', False),  # one value and a message
        ('NULLS = ("", "none", "null", "nan")', False),  # not all values of one enumeration
        ('mode = "fp32"', False),  # one value compared or assigned is a use, not a declaration
    ],
)
def test_the_scan_catches_a_respelling(source: str, caught: bool) -> None:
    assert bool(respellings(source, enumerations())) is caught
