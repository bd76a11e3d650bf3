"""What a sweep measured, apart from where (issue 36): one decision over sweeps of several
clusters is only sound when they ran the same workload. Five parts, each read from a run's tags,
params and metrics through the MLflow API (analysis/runs.py):

- model config: `sq.model_config_sha256` (a pretrained folder's config.json) or else the sha256 of
  the run's `model.*` params but its name, folder and seq_len (a preset's shape);
- method: `sq.method` with its `method.*` params (an adapter's rank, alpha, targets);
- data: `sq.data_fingerprint` (the token file's sampled sha256, whatever its path), or for runs
  logged before it, `synthetic:alphabet=<n>` from the params of a synthetic run;
- seq_len: the `model.seq_len` param;
- tokens per step: `train/tokens_done / train/steps_done` (global tokens per optimizer step).

A sweep's workload is, per part, the set of values its runs have (a sweep may hold two models or
several batch sizes); a part no run of it knows is left out of the comparison. Two sweeps differ
when a part's sets differ.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

from analysis.runs import RunRecord, Sweep
from pipeline.tracking import keys as K

# model.* params that are no part of the model's shape: what it is called, where its files lie,
# and seq_len (a part of its own)
_NOT_SHAPE = ("model.name", "model.pretrained", "model.seq_len")


def model_config(r: RunRecord) -> str | None:
    if digest := r.tag(K.TAG_MODEL_CONFIG_SHA256):
        return f"{r.model} (config.json sha256 {digest[:12]})"
    shape = {k: v for k, v in r.params.items() if k.startswith("model.") and k not in _NOT_SHAPE}
    if not shape:
        return None
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
    return f"{r.model} (model.* sha256 {digest[:12]})"


def method(r: RunRecord) -> str | None:
    settings = sorted((k, v) for k, v in r.params.items() if k.startswith("method.") and k != "method.name")
    name = r.tag(K.TAG_METHOD) or r.params.get("method.name") or "full"
    return name + (
        " " + ",".join(f"{k.removeprefix('method.')}={v}" for k, v in settings) if settings else ""
    )


def data(r: RunRecord) -> str | None:
    if fp := r.tag(K.TAG_DATA_FINGERPRINT):
        return fp
    if r.params.get("data.kind") == "synthetic" and r.params.get("data.alphabet"):
        return f"synthetic:alphabet={r.params['data.alphabet']}"
    return None


def seq_len(r: RunRecord) -> str | None:
    return r.params.get("model.seq_len") or None


def tokens_per_step(r: RunRecord) -> str | None:
    tokens, steps = r.metric(K.TRAIN_TOKENS), r.metric(K.TRAIN_STEPS)
    return f"{tokens / steps:.0f}" if tokens and steps else None


PARTS: tuple[tuple[str, Callable[[RunRecord], str | None]], ...] = (
    ("model config", model_config),
    ("method", method),
    ("data", data),
    ("seq_len", seq_len),
    ("tokens per step", tokens_per_step),
)


def workload(sweep: Sweep) -> dict[str, set[str]]:
    """Each part's values over the sweep's runs (parts no run knows are absent)."""
    out: dict[str, set[str]] = {}
    for part, read in PARTS:
        values = {v for r in sweep.runs if (v := read(r)) is not None}
        if values:
            out[part] = values
    return out


def differences(sweeps: Sequence[Sweep]) -> list[str]:
    """One clause per part in which the sweeps' workloads differ ("seq_len: 20261129-a has 2048,
    20261130-b has 4096"); [] when they agree on every part some run of each knows."""
    loads = [(s.sweep_id, workload(s)) for s in sweeps]
    out = []
    for part, _ in PARTS:
        known = [(sid, w[part]) for sid, w in loads if part in w]
        if len(known) > 1 and any(v != known[0][1] for _, v in known[1:]):
            out.append(f"{part}: " + ", ".join(f"{sid} has {' and '.join(sorted(v))}" for sid, v in known))
    return out
