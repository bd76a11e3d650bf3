"""Every config key with its type, default and the docstring under its schema field, read from
the schema's source (and partition.container's, and each drill's options) with `ast` (no Hydra, no
torch): what `qualify list --keys` prints."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from dataclasses import dataclass
from typing import Any

from pipeline import drills
from pipeline.config import container, schema


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, e.g. train.lr
    type: str  # as annotated in the schema, e.g. "float | None"
    default: Any
    doc: str  # the docstring under the field, on one line ("" if it has none)


def field_docs() -> dict[str, dict[str, tuple[str, str]]]:
    """class name -> field name -> (annotation, docstring) from the schema's source and the
    drills' modules (their options)."""
    sources = [schema, container, *(inspect.getmodule(s.options) for s in drills.SPECS)]
    nodes = [node for m in sources if m is not None for node in ast.parse(inspect.getsource(m)).body]
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for node in nodes:
        if not isinstance(node, ast.ClassDef):
            continue
        fields: dict[str, tuple[str, str]] = {}
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                nxt = body[i + 1] if i + 1 < len(body) else None
                doc = ""
                if (
                    isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)
                ):
                    doc = " ".join(nxt.value.value.split())
                fields[stmt.target.id] = (ast.unparse(stmt.annotation), doc)
        out[node.name] = fields
    return out


def all_keys() -> list[KeyDoc]:
    """Every leaf key of the config, depth first in schema order, with its default."""
    docs = field_docs()
    keys: list[KeyDoc] = []

    def walk(obj: Any, prefix: str) -> None:
        cls_docs = docs.get(type(obj).__name__, {})
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            annotation, doc = cls_docs.get(f.name, (str(f.type), ""))
            key = f"{prefix}{f.name}"
            if dataclasses.is_dataclass(value):
                walk(value, key + ".")
            else:
                keys.append(KeyDoc(key, annotation, value, doc))

    walk(schema.Config(), "")
    return keys


def format_keys(keys: list[KeyDoc]) -> str:
    """One line per key: key, type, default (as YAML would write it), doc."""
    rows = [(k.key, k.type, json.dumps(k.default), k.doc) for k in keys]
    wk = max(len(r[0]) for r in rows)
    wt = max(len(r[1]) for r in rows)
    wd = min(24, max(len(r[2]) for r in rows))
    return "\n".join(f"{k:<{wk}}  {t:<{wt}}  {d:<{wd}}  {doc}" for k, t, d, doc in rows)
