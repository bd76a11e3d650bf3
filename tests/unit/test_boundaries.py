"""Import boundaries: the folders say where code runs, and these tests hold them to it.

Each rule names what a folder may import of the project and which libraries it must never
import; imports inside functions count too (a lazy import still runs where the code runs). A
folder whose functions run elsewhere than its module is imported (the drills: declared on the
login node, run in the job) has a second rule for the imports inside its functions (and under
`if TYPE_CHECKING:`): `inside`, the name of another folder's rule.
`RULES` is the one table: each package's `__init__` docstring states its rule as the line
`stated(rule)` renders, and a test fails when the two differ (copy the line the failure
prints). `test_rules_catch_*` show that the checks fail on a forbidden import, on a cycle and
on a stale docstring.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "analysis")
HEAVY = ("torch", "deepspeed", "transformers", "peft", "bitsandbytes")


@dataclass(frozen=True)
class Rule:
    project: tuple[str, ...]  # project modules it may import (prefixes); its own folder always
    forbid: tuple[str, ...] = ()  # libraries it must not import (prefixes)
    stdlib_only: bool = False  # no third-party library at all, except `allow`
    allow: tuple[str, ...] = ()
    inside: str = ""  # imports inside functions keep to RULES[inside] (plus that folder) instead


# most specific module prefix first
RULES: dict[str, Rule] = {
    "pipeline.home": Rule(project=(), stdlib_only=True),
    "pipeline.files": Rule(project=(), stdlib_only=True),  # the atomic write: everyone imports it
    "pipeline.logs": Rule(project=(), stdlib_only=True),  # the entry points' log setup
    "pipeline.measure": Rule(project=(), stdlib_only=True, allow=("numpy",)),
    # the drills: declared at import (read by the config, the estimate and the job's registry on
    # the login node), their runtime functions run in the job and import its code inside them
    "pipeline.drills": Rule(
        project=("pipeline.config.checks", "pipeline.contract.records"),
        stdlib_only=True,
        inside="pipeline.job",
    ),
    # chat templates are rendered on the login node through transformers' tokenizer (no torch):
    # only this module may import transformers, inside its functions (test_login_node_imports)
    "pipeline.data.render": Rule(
        project=("pipeline.data", "pipeline.files", "pipeline.measure.kinds"),
        forbid=("torch", "deepspeed", "peft", "bitsandbytes", "mlflow", "submitit", "hydra"),
    ),
    "pipeline.data": Rule(
        project=("pipeline.files", "pipeline.measure.kinds"), forbid=(*HEAVY, "mlflow", "submitit", "hydra")
    ),
    "pipeline.config.compose": Rule(
        project=(
            "pipeline.config",
            "pipeline.drills",
            "pipeline.home",
            "pipeline.measure",
            "pipeline.tracking.keys",
            "pipeline.tracking.redact",
            "pipeline.data",
            "pipeline.files",
        ),
        forbid=(*HEAVY, "mlflow", "submitit"),
    ),
    "pipeline.config": Rule(
        project=(
            "pipeline.config",
            "pipeline.drills",
            "pipeline.home",
            "pipeline.measure",
            "pipeline.tracking.keys",
            "pipeline.tracking.redact",
            "pipeline.data",
            "pipeline.files",
        ),
        forbid=(*HEAVY, "mlflow", "submitit", "hydra"),
    ),
    "pipeline.slurm": Rule(
        project=("pipeline.config.schema",), forbid=(*HEAVY, "mlflow", "submitit", "hydra")
    ),
    # the scheduler interface: the only importer of pipeline.slurm
    "pipeline.sched": Rule(
        project=("pipeline.slurm", "pipeline.config.schema"), forbid=(*HEAVY, "mlflow", "submitit", "hydra")
    ),
    "pipeline.tracking": Rule(
        project=("pipeline.home", "pipeline.files"), forbid=(*HEAVY, "submitit", "hydra", "omegaconf")
    ),
    "pipeline.submit": Rule(
        project=(
            "pipeline.config",
            "pipeline.drills",
            "pipeline.sched",
            "pipeline.tracking",
            "pipeline.measure",
            "pipeline.home",
            "pipeline.contract",
            "pipeline.job.task",  # the callable submitit pickles: the one door into the job
            "pipeline.files",
        ),
        forbid=HEAVY,
    ),
    "pipeline.contract": Rule(
        project=(
            "pipeline.config.schema",
            "pipeline.measure",
            "pipeline.sched",
            "pipeline.tracking",
            "pipeline.files",
        ),
        forbid=(*HEAVY, "hydra", "submitit"),
    ),
    "pipeline.contract.spec": Rule(project=(), forbid=(*HEAVY, "mlflow", "hydra", "submitit")),
    "pipeline.job.task": Rule(project=("pipeline.contract.spec", "pipeline.job.entry"), forbid=HEAVY),
    "pipeline.job": Rule(
        project=(
            "pipeline.contract",
            "pipeline.drills",
            "pipeline.train",
            "pipeline.measure",
            "pipeline.tracking",
            "pipeline.sched",
            "pipeline.data",
            "pipeline.config.schema",
            "pipeline.config.pretrained",
            "pipeline.config.resolved",
            "pipeline.config.validate",
            "pipeline.home",
            "pipeline.files",
            "pipeline.logs",
        ),
        forbid=("hydra",),
    ),
    "pipeline.train": Rule(
        project=(
            "pipeline.measure",
            "pipeline.config.schema",
            "pipeline.config.pretrained",
            "pipeline.config.dsconfig",  # the DeepSpeed config the validation sizes the probe from
            "pipeline.data",
            "pipeline.tracking.keys",  # the names of the metrics its sink gets: constants, no MLflow
            "pipeline.files",
        ),
        forbid=("hydra", "omegaconf", "submitit", "mlflow"),
    ),
    "pipeline.cli": Rule(project=("pipeline",), forbid=HEAVY),
    "pipeline": Rule(project=("pipeline",), forbid=HEAVY),
    "analysis": Rule(
        project=(
            "pipeline.measure",
            "pipeline.tracking",
            "pipeline.home",
            "pipeline.contract.sweepdir",
            "pipeline.contract.outcome",
        ),
        forbid=(*HEAVY, "submitit", "hydra", "sqlite3", "sqlalchemy"),
    ),
}

PACKAGE_RULE_LINE = "Import rule (tests/unit/test_boundaries.py):"


def _short(name: str) -> str:
    return f"`{name.removeprefix('pipeline.')}`"


def stated(rule: Rule) -> str:
    """The one line a package's docstring states its rule with, rendered from `RULES`."""
    parts = [
        f"besides itself, of the project it may import {', '.join(map(_short, rule.project)) or 'nothing'}"
    ]
    if rule.stdlib_only:
        parts.append("of libraries only the standard library" + "".join(f" and {a}" for a in rule.allow))
    if rule.forbid:
        parts.append(f"never {', '.join(rule.forbid)}")
    if rule.inside:
        parts.append(
            f"inside its functions (and under `if TYPE_CHECKING:`) {_short(rule.inside)} and what it may import"
        )
    return f"{PACKAGE_RULE_LINE} {'; '.join(parts)}."


def docstring_problems(root: Path) -> list[str]:
    """Each package whose `__init__` docstring does not state its rule as `RULES` has it."""
    out = []
    for pkg_init in sorted([*root.glob("pipeline/*/__init__.py"), root / "analysis" / "__init__.py"]):
        module = ".".join(pkg_init.parent.relative_to(root).parts)
        doc = " ".join((ast.get_docstring(ast.parse(pkg_init.read_text())) or "").split())
        want = stated(rule_for(module))
        if want not in doc:
            out.append(f"{pkg_init.relative_to(root)}: its docstring must end with the line\n    {want}")
        elif doc.count(PACKAGE_RULE_LINE) != 1:
            out.append(f"{pkg_init.relative_to(root)}: states its import rule more than once")
    return out


# what the login node imports: none of it may pull torch or DeepSpeed in at import time
LOGIN_NODE = (
    "pipeline.config",
    "pipeline.submit",
    "pipeline.sched",
    "pipeline.slurm",
    "pipeline.tracking",
    "pipeline.measure",
    "pipeline.data",
    "pipeline.contract",
    "pipeline.drills",
)
LOGIN_NODE_MODULES = (
    "pipeline.home",
    "pipeline.cli",
    "pipeline.job.task",
)


def modules_of(root: Path) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            name = ".".join(f.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, those inside functions included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def deferred_lines(path: Path) -> set[int]:
    """The lines of the imports that do not run when the module is imported: those inside a
    function, and those under `if TYPE_CHECKING:`."""
    out: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        deferred = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
            isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        )
        if deferred:
            out |= {n.lineno for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)}
    return out


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def rule_for(module: str) -> Rule:
    for prefix in sorted(RULES, key=len, reverse=True):
        if _within(module, (prefix,)):
            return RULES[prefix]
    raise KeyError(f"no import rule covers {module}: add one to RULES")


def violations(root: Path) -> list[str]:
    mods = modules_of(root)
    project = {m.split(".")[0] for m in mods}
    out = []
    for module, path in mods.items():
        at_import = rule_for(module)
        own = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
        own_pkg = ".".join(own.split(".")[:2])
        found = imports_of(path)
        deferred = deferred_lines(path) if at_import.inside else set()
        for line, name in found:
            if any(ln == line and other.startswith(name + ".") and other in mods for ln, other in found):
                continue  # `from pkg import module`: the module is checked, not the package
            rule = at_import
            if line in deferred:  # run only when called: the rule of the folder it runs in
                lazy = RULES[at_import.inside]
                rule = Rule(project=(at_import.inside, *lazy.project), forbid=lazy.forbid)
            top = name.split(".")[0]
            where = f"{path.relative_to(root)}:{line} imports {name}"
            if top in project:
                if name not in mods and name.rpartition(".")[0] in mods:
                    name = name.rpartition(".")[0]  # `from pkg.mod import symbol`
                if name not in mods and not any(m.startswith(name + ".") for m in mods):
                    continue  # a symbol of a package's __init__
                if not _within(name, (own_pkg, *rule.project)) and name != "pipeline":
                    out.append(
                        f"{where}: {module} may import only {own_pkg}, {', '.join(rule.project) or 'nothing else'}"
                    )
            elif _within(name, rule.forbid):
                out.append(f"{where}: {module} must not import {top}")
            elif rule.stdlib_only and top not in sys.stdlib_module_names and not _within(name, rule.allow):
                out.append(f"{where}: {module} may import only the standard library")
    return sorted(set(out))


def cycles(root: Path) -> list[str]:
    mods = modules_of(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for _, name in imports_of(path):
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != m and not m.startswith(name + "."):
                graph[m].add(name)
    out = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], {start}
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    out.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    return out


def test_every_module_keeps_to_its_folders_rule() -> None:
    assert violations(REPO) == []


def test_each_package_docstring_states_its_rule() -> None:
    problems = docstring_problems(REPO)
    assert not problems, "\n".join(problems)


def test_rules_catch_a_stale_docstring(tmp_path: Path) -> None:
    """A docstring that states another rule (here: a rule from before `files` was allowed) fails."""
    old = Rule(project=("pipeline.config.schema",), forbid=(*HEAVY, "mlflow", "submitit", "hydra"))
    root = _fake_tree(tmp_path, {"pipeline/data/__init__.py": f'"""The data.\n\n{stated(old)}"""\n'})
    assert any("pipeline/data/__init__.py" in p for p in docstring_problems(root))
    good = stated(RULES["pipeline.data"])
    (root / "pipeline/data/__init__.py").write_text(f'"""The data.\n\n{good}"""\n')
    assert not [p for p in docstring_problems(root) if "pipeline/data" in p]


def test_no_import_cycle_lazy_imports_included() -> None:
    assert cycles(REPO) == []


def test_the_login_node_never_loads_torch_or_deepspeed() -> None:
    names = [
        m
        for m in modules_of(REPO)
        if _within(m, LOGIN_NODE) or m in LOGIN_NODE_MODULES or m.startswith("analysis")
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {names!r}: importlib.import_module(m)\n"
        "bad = sorted(m for m in ('torch', 'deepspeed', 'transformers', 'pipeline.job.entry', 'pipeline.train') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def _fake_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, src in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    return tmp_path


@pytest.mark.parametrize(
    ("rel", "src", "expect"),
    [
        ("pipeline/measure/bad.py", "def f():\n    import torch\n", "may import only the standard library"),
        ("pipeline/train/bad.py", "import mlflow\n", "must not import mlflow"),
        ("pipeline/train/bad2.py", "from pipeline.job import entry\n", "may import only"),
        (
            "pipeline/submit/bad.py",
            "def f():\n    from pipeline.train.trainer import Trainer\n",
            "may import only",
        ),
        (
            "pipeline/config/schema.py",
            "from hydra.core.config_store import ConfigStore\n",
            "must not import hydra",
        ),
        ("analysis/bad.py", "import sqlite3\n", "must not import sqlite3"),
        # a drill's module is imported on the login node: torch and the job only inside functions
        ("pipeline/drills/bad.py", "import torch\n", "may import only the standard library"),
        ("pipeline/drills/bad2.py", "from pipeline.job import entry\n", "may import only"),
        ("pipeline/drills/bad3.py", "if True:\n    from pipeline.train import trainer\n", "may import only"),
        ("pipeline/drills/bad4.py", "def f():\n    import hydra\n", "must not import hydra"),
        ("pipeline/drills/bad5.py", "def f():\n    from analysis import report\n", "may import only"),
    ],
)
def test_rules_catch_a_forbidden_import(tmp_path: Path, rel: str, src: str, expect: str) -> None:
    extra = {
        "pipeline/job/entry.py": "",
        "pipeline/train/trainer.py": "",
        "pipeline/job/__init__.py": "",
        "pipeline/train/__init__.py": "",
    }
    root = _fake_tree(tmp_path, {**extra, rel: src})
    found = violations(root)
    assert any(expect in v and rel in v for v in found), found


def test_a_drill_imports_the_job_inside_its_functions(tmp_path: Path) -> None:
    """What runs only in the job (a drill's runtime functions, its type-checking imports) may
    import the job's code and torch; the same imports at the module's top level may not."""
    src = (
        "from typing import TYPE_CHECKING\n"
        "from pipeline.drills.base import DrillSpec\n"
        "if TYPE_CHECKING:\n    from pipeline.job.entry import x\n"
        "def hook(ctx):\n    import torch\n    from pipeline.train.trainer import Trainer\n"
        "    from pipeline.job import entry\n"
    )
    extra = {
        "pipeline/drills/base.py": "",
        "pipeline/job/__init__.py": "",
        "pipeline/job/entry.py": "",
        "pipeline/train/__init__.py": "",
        "pipeline/train/trainer.py": "",
        "pipeline/drills/__init__.py": "",
    }
    root = _fake_tree(tmp_path, {**extra, "pipeline/drills/good.py": src})
    assert [v for v in violations(root) if "pipeline/drills/" in v] == []


def test_cycle_check_catches_a_lazy_cycle(tmp_path: Path) -> None:
    root = _fake_tree(
        tmp_path,
        {
            "pipeline/job/a.py": "from pipeline.job import b\n",
            "pipeline/job/b.py": "def f():\n    from pipeline.job.a import x\n",
        },
    )
    assert cycles(root), "a cycle through a lazy import must be found"
