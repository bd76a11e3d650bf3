"""The repository is self-contained: nothing it ships points at files outside it."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORD, UP = "DES" + "IGN", ".."  # spelt in parts, so that this file does not match itself
OUTSIDE = re.compile(rf"\.\./shared|shared/{WORD}|{WORD}\.md|\b{WORD}\b")
"""A design page outside the repository (the project's working notes): point at docs/design.md."""


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [ROOT / p for p in out.split("\0") if p]


def hits(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):  # binary files, a file deleted but not yet staged
        return []
    rel = path.relative_to(ROOT)
    return [
        f"{rel}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)
    ]


def test_nothing_points_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 50  # really the repository's files
    found = [h for f in files for h in hits(f)]
    assert not found, "pointers outside the repository (use docs/design.md instead):\n" + "\n".join(found)


def test_the_scan_finds_a_pointer() -> None:
    """The pattern catches each spelling the old pointers used, and not the new one."""
    for line in (f"see {UP}/shared/x.md", f'({WORD} "Cost")', f"{WORD}.md's Cost", f"shared/{WORD}"):
        assert OUTSIDE.search(line), line
    assert not OUTSIDE.search('docs/design.md, "Cost"; the design of the sweep')


def test_design_doc_is_where_the_pointers_point() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    for heading in ("Cost", "Goodput and badput", "Restart and lost work", "The numbers"):
        assert re.search(rf"^#+ {re.escape(heading)}$", design, re.M), heading


def test_design_doc_defines_every_key_the_job_writes() -> None:
    """Each metric and tag of pipeline/tracking/keys.py is named in docs/design.md."""
    from pipeline.tracking import keys as K

    design = (ROOT / "docs" / "design.md").read_text()
    names = {
        v
        for n, v in vars(K).items()
        if n.isupper() and isinstance(v, str) and ("/" in v or n.startswith("TAG_"))
    }
    assert len(names) > 80
    missing = sorted(k for k in names if f"`{k}`" not in design and f"`{k}<" not in design)
    assert not missing, f"define these keys in docs/design.md: {missing}"


def test_a_main_guard_is_the_last_statement_of_its_module() -> None:
    """`python -m pipeline.job.entry` (ranks started as srun starts them) runs the guard as the
    module is read: a function defined below it does not exist yet (a NameError that only hand-
    started ranks met: the clean-clone CI run found it)."""
    import ast

    late = []
    repo = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=repo, capture_output=True, text=True, check=True
    )
    for name in tracked.stdout.split():
        path = repo / name
        body = ast.parse(path.read_text()).body
        for i, node in enumerate(body):
            if (
                isinstance(node, ast.If)
                and isinstance(node.test, ast.Compare)
                and isinstance(node.test.left, ast.Name)
                and node.test.left.id == "__name__"
                and i != len(body) - 1
            ):
                late.append(str(path))
    assert not late, f"statements after the __main__ guard: {late}"


KEY_SHAPE = re.compile(r"^(sq|mlflow)\.[A-Za-z_.{}]*$|^[a-z]+/[A-Za-z_0-9{}/]*$")
"""What an MLflow key looks like: a tag `sq.x` or `mlflow.x`, a metric `area/name` (`{}`: the
parts of an f-string filled in at run time)."""
NOT_KEYS: dict[tuple[str, str], str] = {
    # (module, literal): why a string shaped like a key is not one
    ("pipeline/job/startup.py", "mlflow.server"): "a module whose import time is measured",
    ("pipeline/sched/warm.py", "mlflow.store.tracking.sqlalchemy_store"): "a module the warm server imports",
    ("pipeline/slurm/cluster.py", "gres/gpu"): "Slurm's TRES name",
    ("pipeline/submit/status.py", "tok/s"): "a column heading",
    ("analysis/baseline.py", "tokens/s"): "a column heading",
    ("analysis/report.py", "tokens/s"): "a column heading",
    ("analysis/report.py", "report/{}"): "an artifact folder of the parent run, not a key",
    ("analysis/baseline.py", "partition/model/precision"): "words of a comment in the references file",
}


def key_literals(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string literal or f-string (its fixed parts, `{}` for the rest)
    shaped like an MLflow key."""
    import ast

    tree = ast.parse(source)
    fstrings = [n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)]
    parts = {id(v) for f in fstrings for v in f.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            text = node.value
        else:
            continue
        if KEY_SHAPE.match(text):
            found.append((node.lineno, text))
    return sorted(found)


def test_every_key_is_spelled_only_in_keys_py() -> None:
    """The documented-keys test above reads keys.py; this one makes keys.py the only place a key
    is spelled, so that test sees every key the code logs (a hand-typed `train/loss` in the
    trainer, a tag in a set_tags call)."""
    typed = []
    for pkg in ("pipeline", "analysis"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel == "pipeline/tracking/keys.py":
                continue
            for line, text in key_literals(path.read_text()):
                if (rel, text) not in NOT_KEYS:
                    typed.append(f"{rel}:{line}: {text!r}")
    stale = [k for k in NOT_KEYS if not any(t == k[1] for _, t in key_literals((ROOT / k[0]).read_text()))]
    assert not typed, "spell these keys in pipeline/tracking/keys.py and use the constant:\n" + "\n".join(
        typed
    )
    assert not stale, f"no longer in the code: drop from NOT_KEYS: {stale}"


def test_the_key_scan_finds_a_hand_typed_key() -> None:
    src = 'def f(t, loss, n):\n    t.log_metrics({"train/loss": loss})\n    t.set_tags({"sq.last_stop": "x", f"sys/{n}/w": 1})\n'
    assert [text for _, text in key_literals(src)] == ["train/loss", "sq.last_stop", "sys/{}/w"]
    assert key_literals('t.log_metrics({K.TRAIN_LOSS: loss}); print("a plain sentence")') == []


SYS_PATH_EDIT = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=|syspath_prepend")


def test_no_sys_path_edits_in_tests_or_benchmarks() -> None:
    """tests/support and benchmarks import as packages (pytest's `pythonpath`, `python -m`): a
    sys.path edit would make an import depend on where a file sits or who ran it first."""
    files = [p for folder in ("tests", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    assert len(files) > 40
    edits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        if p.name != Path(__file__).name
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if SYS_PATH_EDIT.search(line)
    ]
    assert edits == []


def _imported(node: ast.AST, package: str) -> list[str]:
    """The modules an import statement names (a relative one resolved against `package`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def _is_test_module(name: str) -> bool:
    """Another test module or a benchmark: tests/unit, tests/integration, a bare `test_*` or
    conftest (pytest's rootdir imports), benchmarks/. tests/support is what they share."""
    parts = name.split(".")
    return (
        parts[0] == "benchmarks"
        or parts[:2] in (["tests", "unit"], ["tests", "integration"])
        or parts[0].startswith("test_")
        or parts[0] == "conftest"
    )


def imports_of_test_modules(root: Path) -> list[str]:
    """Every import, under tests/, of a test module or a benchmark."""
    out = []
    for path in sorted((root / "tests").rglob("*.py")):
        rel = path.relative_to(root)
        package = ".".join(rel.parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            bad = sorted({n for n in _imported(node, package) if _is_test_module(n)})
            if bad:
                out.append(f"{rel}:{getattr(node, 'lineno', 0)}: imports {bad[0]}")
    return out


def test_no_test_imports_another_test_module_or_a_benchmark() -> None:
    """Shared test code lives in tests/support (benchmarks import it there too): a test that
    imports another test module's helpers runs that module's collection-time code and breaks
    when its private names change; one that imports a benchmark depends on a script."""
    found = imports_of_test_modules(ROOT)
    assert not found, "move the shared code to tests/support:\n" + "\n".join(found)


def test_the_import_scan_finds_a_test_module_imported(tmp_path: Path) -> None:
    files = {
        "tests/unit/test_a.py": "from tests.integration.test_b import helper\nimport benchmarks.bench_c\n",
        "tests/unit/test_d.py": "def f():\n    from . import test_a\n    from test_b import x\n",
        "tests/integration/test_b.py": "from tests.support.helpers import qualify\nfrom tests.support import fakes\n",
        "tests/support/helpers.py": "from tests.support.fakes import FakeEngine\nfrom pipeline import test_like\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert imports_of_test_modules(tmp_path) == [
        "tests/unit/test_a.py:1: imports tests.integration.test_b",
        "tests/unit/test_a.py:2: imports benchmarks.bench_c",
        "tests/unit/test_d.py:2: imports tests.unit",
        "tests/unit/test_d.py:3: imports test_b",
    ]
