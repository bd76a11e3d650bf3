"""A state is spelled once: each enum of `pipeline/` owns its values, and no other module (of
`pipeline/` or `analysis/`) compares with, or keys a dict by, the same string spelled by hand (a renamed member would then
leave that comparison silently false).

The enums are found by reading the code (every class with `Enum` among its bases); a member's
value is its string literal, or the `keys.py` constant it names (`RUNNING = K.OUTCOME_RUNNING`:
then keys.py is where it is spelled). The scan looks at comparisons (`==`, `!=`, `in`, `not in`,
against a literal or a tuple, list or set of literals), `case` patterns and dict keys: where a state is used
as a state. A value that is also an unrelated word somewhere is allowed below, with why.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KEYS = REPO / "pipeline" / "tracking" / "keys.py"

ALLOWED: dict[tuple[str, str], str] = {
    # (module, value): why the literal there is not the enum's state
    (
        "pipeline/submit/billing.py",
        "error",
    ): "billed.json's field saying why a point has no bill, not an outcome",
}


def _keys_constants() -> dict[str, str]:
    out = {}
    for node in ast.parse(KEYS.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if isinstance(t, ast.Name) and isinstance(node.value.value, str):
                    out[t.id] = node.value.value
    return out


def _is_enum(cls: ast.ClassDef) -> bool:
    names = {
        b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in cls.bases
    }
    return bool(names & {"Enum", "StrEnum", "IntEnum"})


def enum_values(root: Path) -> dict[str, tuple[str, str]]:
    """value -> (the module that owns it, Enum.MEMBER), for every string-valued member."""
    consts = _keys_constants()
    out: dict[str, tuple[str, str]] = {}
    for path in sorted((root / "pipeline").rglob("*.py")):
        rel = str(path.relative_to(root))
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            if not _is_enum(cls):
                continue
            for stmt in cls.body:
                if not (isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name)):
                    continue
                v = stmt.value
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    out[v.value] = (rel, f"{cls.name}.{stmt.targets[0].id}")
                elif isinstance(v, ast.Attribute) and v.attr in consts:  # K.OUTCOME_RUNNING
                    out[consts[v.attr]] = (str(KEYS.relative_to(root)), f"{cls.name}.{stmt.targets[0].id}")
    return out


def _literals(node: ast.AST) -> list[ast.Constant]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [e for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def state_literals(tree: ast.AST) -> list[ast.Constant]:
    """String literals used as a state: in a comparison or as a dict key."""
    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += _literals(side)
        elif isinstance(node, ast.MatchValue):  # case "failed":
            found += _literals(node.value)
        elif isinstance(node, ast.Dict):
            found += [k for k in node.keys if k is not None for k in _literals(k)]
    return found


SCANNED = ("pipeline", "analysis")
"""Where a state is compared: the product code and the login node's analysis (the report reads
the outcomes and reasons the jobs wrote, through pipeline.contract.outcome's enums)."""


def spelled_twice(root: Path) -> list[str]:
    values = enum_values(root)
    out = []
    for path in sorted(p for folder in SCANNED for p in (root / folder).rglob("*.py")):
        rel = str(path.relative_to(root))
        for lit in state_literals(ast.parse(path.read_text())):
            owner = values.get(lit.value)
            if owner and owner[0] != rel and (rel, lit.value) not in ALLOWED:
                out.append(f"{rel}:{lit.lineno}: {lit.value!r} is {owner[1]} (spelled in {owner[0]})")
    return out


@functools.cache
def repo_findings() -> tuple[str, ...]:
    """spelled_twice on the repository, scanned once for the tests that read it."""
    return tuple(spelled_twice(REPO))


def test_no_enum_value_is_spelled_twice() -> None:
    values = enum_values(REPO)
    assert {"pending", "requeued", "m", "e"} <= set(values), (
        "the scan finds the enums (PointStatus, EventKind)"
    )
    found = repo_findings()
    assert not found, "use the enum member instead of the string:\n" + "\n".join(found)


def test_the_allow_list_is_not_stale() -> None:
    """Each allowed spelling still exists (else the exception is dead and must go)."""
    values = enum_values(REPO)
    for (rel, value), why in ALLOWED.items():
        assert value in values, f"{value!r} is no enum's value any more: drop ({rel}, {why})"
        lits = [c.value for c in state_literals(ast.parse((REPO / rel).read_text()))]
        assert value in lits, f"{rel} no longer compares with {value!r}: drop it from ALLOWED"


def test_the_scan_catches_a_state_spelled_by_hand(tmp_path: Path) -> None:
    pkg = tmp_path / "pipeline"
    (pkg / "tracking").mkdir(parents=True)
    (pkg / "tracking" / "keys.py").write_text('OUTCOME_RUNNING = "running"\n')
    (pkg / "a.py").write_text(
        "from enum import Enum\nfrom pipeline.tracking import keys as K\n"
        "class S(str, Enum):\n    WAITING = 'waiting'\n    RUNNING = K.OUTCOME_RUNNING\n"
    )
    (pkg / "b.py").write_text("def f(s):\n    return s == 'waiting' or s in ('running',) or {'waiting': 1}\n")
    (pkg / "c.py").write_text(
        "def g(s):\n    return print('waiting') or s == S.WAITING\n"
    )  # a message, not a state
    global KEYS
    saved, KEYS = KEYS, pkg / "tracking" / "keys.py"
    try:
        found = spelled_twice(tmp_path)
    finally:
        KEYS = saved
    assert sorted(f.split(":")[0] + ":" + f.split(":")[1] for f in found) == ["pipeline/b.py:2"] * 3, found


OUTCOME = REPO / "pipeline" / "contract" / "outcome.py"


def test_no_outcome_or_reason_literal_is_compared_outside_the_enums_module(tmp_path: Path) -> None:
    """Issue 35's acceptance: an outcome or a reason is compared through Outcome / Reason
    (pipeline/contract/outcome.py) everywhere else, in pipeline/ and analysis/: on the repository
    nothing is found; in a fake tree with the real enums' module, `x == "failed"`, `reason in
    ("oom", ...)` and a `case "accepted":` are, in either folder."""
    owners = enum_values(REPO)
    assert owners["failed"] == ("pipeline/contract/outcome.py", "Outcome.FAILED")
    assert owners["oom"] == ("pipeline/contract/outcome.py", "Reason.OOM")
    found = [f for f in repo_findings() if " is Outcome." in f or " is Reason." in f]
    assert not found, "compare with the Outcome / Reason member:\n" + "\n".join(found)

    (tmp_path / "pipeline" / "contract").mkdir(parents=True)
    (tmp_path / "analysis").mkdir()
    (tmp_path / "pipeline" / "contract" / "outcome.py").write_text(OUTCOME.read_text())
    (tmp_path / "analysis" / "table.py").write_text(
        "def row(x, reason):\n    return x == 'failed' or reason in ('oom', 'crash')\n"
    )
    (tmp_path / "pipeline" / "status.py").write_text(
        "def show(o):\n    match o:\n        case 'accepted':\n            return 1\n"
        "    return Outcome.FAILED == o or print('failed')\n"  # the member, and a message: fine
    )
    found = spelled_twice(tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "'failed' is Outcome.FAILED (spelled in pipeline/contract/outcome.py)",
        "'oom' is Reason.OOM (spelled in pipeline/contract/outcome.py)",
        "'crash' is Reason.CRASH (spelled in pipeline/contract/outcome.py)",
        "'accepted' is Outcome.ACCEPTED (spelled in pipeline/contract/outcome.py)",
    ], found
