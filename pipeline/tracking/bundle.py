"""An export bundle (`qualify export`, `pipeline.tracking.transfer`) read as untrusted input.

A bundle comes from another cluster, another user, or a hand: every name in it that import
joins into a path or a query is checked, and the whole bundle is read and checked before the
first write to the destination store (`read_bundle`). Refused, each naming the field:

- bundle.json: `sweep_id` and each run id that is no plain name (`pipeline.home.is_plain_name`:
  no `/`, no `..`); an `experiment` that is absolute, has a `..` part or control characters;
  a ledger path that is absolute or has a `..` part, or names a run the bundle does not hold;
- run.json: fields of the wrong type, a status MLflow does not have, a `sq.sweep_id` or
  `sq.origin_run_id` tag that is no plain name;
- metrics.jsonl: a line that is no JSON object of key, value, timestamp and step (file:line);
- any symbolic link, device, FIFO or socket in the bundle (export writes regular files only):
  a link would have the import read, and copy into the store, a file outside the bundle.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.files import read_json
from pipeline.home import is_plain_name
from pipeline.tracking import keys as K

BUNDLE_FORMAT = 1
BUNDLE_FILE = "bundle.json"
RUNS, LEDGERS = "runs", "ledgers"
RUN_FILE, METRICS_FILE, ARTIFACTS = "run.json", "metrics.jsonl", "artifacts"
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
_NOT_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # export writes repr(value)
MAX_EXPERIMENT = 500  # MLflow's limit on an experiment's name


class TransferError(Exception):
    """Bad input to export or import (an unknown sweep, an unreadable store or bundle): one
    paragraph, exit 2, nothing written."""


def _refuse(bundle: Path, where: str, problem: str) -> TransferError:
    return TransferError(
        f"import: the bundle {bundle} is refused: {where}: {problem}. Nothing was imported "
        "(a bundle is checked whole before anything is written); export the sweep again from its store."
    )


def experiment_problem(name: object) -> str | None:
    """Why `name` cannot be an experiment's name taken from elsewhere, or None."""
    if not isinstance(name, str) or not name.strip():
        return f"{name!r} is no experiment name"
    if len(name) > MAX_EXPERIMENT:
        return f"{len(name)} characters, over MLflow's {MAX_EXPERIMENT}"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"{name!r} holds control characters"
    if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
        return f"{name!r} is a path that leaves its folder (absolute, or with a '..' part)"
    return None


def _ledger_problem(rel: object) -> str | None:
    if not isinstance(rel, str) or not rel or rel.startswith(("/", "\\")):
        return "not a relative path"
    parts = rel.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 for c in rel):
        return "a path with an empty, '.' or '..' part or control characters"
    return None


def read_bundle(bundle: Path) -> dict[str, Any]:
    """bundle.json and every run's run.json, checked with everything else the import will read
    (metrics.jsonl line by line, no link or special file anywhere): TransferError, naming the
    field, when the folder is no complete bundle or holds anything the import must not take."""
    meta = read_json(bundle / BUNDLE_FILE) if bundle.is_dir() else None
    if not isinstance(meta, dict) or not isinstance(meta.get("runs"), list) or not meta.get("sweep_id"):
        raise TransferError(
            f"import: {bundle} is no complete export bundle (no readable {BUNDLE_FILE}: written last by "
            "`qualify export`, so an interrupted export has none). Export the sweep again."
        )
    if meta.get("format") != BUNDLE_FORMAT:
        raise TransferError(
            f"import: {bundle} is a bundle of format {meta.get('format')!r}; this version reads format {BUNDLE_FORMAT}."
        )
    _check_meta(bundle, meta)
    _check_files(bundle)
    infos = {r: _run_info(bundle, r) for r in meta["runs"]}
    for r in meta["runs"]:
        for _ in metric_values(bundle, r):
            pass
    return meta | {"infos": infos}


def _check_meta(bundle: Path, meta: dict[str, Any]) -> None:
    f = BUNDLE_FILE
    if not is_plain_name(meta["sweep_id"]):
        raise _refuse(
            bundle, f"{f} field 'sweep_id'", f"{meta['sweep_id']!r} is no sweep id (one plain name)"
        )
    if problem := experiment_problem(meta.get("experiment")):
        raise _refuse(bundle, f"{f} field 'experiment'", problem)
    if not isinstance(meta.get("source", ""), str):
        raise _refuse(bundle, f"{f} field 'source'", "not text")
    runs = meta["runs"]
    for r in runs:
        if not is_plain_name(r):
            raise _refuse(bundle, f"{f} field 'runs'", f"{r!r} is no run id (one plain name)")
    if not runs or len(set(runs)) != len(runs):
        raise _refuse(bundle, f"{f} field 'runs'", "empty, or a run id listed twice")
    ledgers = meta.get("ledgers") or {}
    if not isinstance(ledgers, dict):
        raise _refuse(bundle, f"{f} field 'ledgers'", "not a mapping of ledger folders to run ids")
    for rel, run_id in ledgers.items():
        if problem := _ledger_problem(rel):
            raise _refuse(bundle, f"{f} field 'ledgers', key {rel!r}", problem)
        if run_id and run_id not in runs:
            raise _refuse(
                bundle, f"{f} field 'ledgers', key {rel!r}", f"run {run_id!r} is no run of the bundle"
            )
        if not (bundle / LEDGERS / rel).is_dir():
            raise _refuse(
                bundle, f"{f} field 'ledgers', key {rel!r}", f"no folder {LEDGERS}/{rel} in the bundle"
            )


def _check_files(bundle: Path) -> None:
    """No symbolic link and nothing but folders and regular files under the bundle."""
    for top, dirs, files in os.walk(bundle):
        for name in dirs + files:
            path = Path(top) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise _refuse(
                    bundle,
                    str(path.relative_to(bundle)),
                    f"a symbolic link (to {os.readlink(path)}): a bundle holds regular files only "
                    "(`qualify export` writes no link), and a link would be read from outside it",
                )
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise _refuse(bundle, str(path.relative_to(bundle)), "neither a folder nor a regular file")


def _run_info(bundle: Path, run_id: str) -> dict[str, Any]:
    where = f"{RUNS}/{run_id}/{RUN_FILE}"
    info = read_json(bundle / RUNS / run_id / RUN_FILE)
    if not isinstance(info, dict):
        raise _refuse(bundle, where, "missing or not a JSON object")
    for name in ("tags", "params"):
        value = info.get(name)
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in [*value, *value.values()]):
            raise _refuse(bundle, f"{where} field '{name}'", "not a mapping of text to text")
    if info.get("status") not in STATUSES:
        raise _refuse(
            bundle, f"{where} field 'status'", f"{info.get('status')!r} is none of {', '.join(STATUSES)}"
        )
    if not isinstance(info.get("name"), (str, type(None))):
        raise _refuse(bundle, f"{where} field 'name'", "not text")
    for name in ("start_time", "end_time"):
        if not isinstance(info.get(name), (int, type(None))) or isinstance(info.get(name), bool):
            raise _refuse(bundle, f"{where} field '{name}'", "not a time in milliseconds")
    for tag in (K.TAG_SWEEP_ID, K.TAG_ORIGIN_RUN_ID, K.TAG_MLFLOW_PARENT):
        if tag in info["tags"] and not is_plain_name(info["tags"][tag]):
            raise _refuse(bundle, f"{where} tag '{tag}'", f"{info['tags'][tag]!r} is no plain name")
    return info


def metric_values(bundle: Path, run_id: str) -> Iterator[tuple[str, float, int, int]]:
    """The run's metric values from its metrics.jsonl, (key, value, timestamp, step) each;
    TransferError naming file:line at the first line that is not one."""
    path = bundle / RUNS / run_id / METRICS_FILE
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            try:
                m = json.loads(line)
                value = m["value"]
                value = _NOT_FINITE[value] if isinstance(value, str) else value
                ok = (
                    isinstance(m["key"], str)
                    and m["key"]
                    and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                    and all(
                        isinstance(m[k], int) and not isinstance(m[k], bool) for k in ("timestamp", "step")
                    )
                )
            except (ValueError, TypeError, KeyError):
                ok = False
            if not ok:
                raise _refuse(
                    bundle,
                    f"{RUNS}/{run_id}/{METRICS_FILE}:{n}",
                    f"not a JSON object of key, value, timestamp and step ({line[:80]!r})",
                )
            yield m["key"], float(value), m["timestamp"], m["step"]
