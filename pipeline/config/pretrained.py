"""A user's own model, `model.pretrained=<folder or hub name>`, read at composition without
torch or transformers: its config.json gives the family and the shape the memory model and the
FLOPs need. A folder must exist and hold config.json; a hub name must already be in the local
Hugging Face cache (nothing is downloaded, ever). Every problem is one
PretrainedError paragraph (the schema raises it as a ConfigError); this module imports only
pipeline.measure of the project, so the schema can call it without a cycle. `describe` gives the
model's own description (any family), made by transformers in a helper process."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.files import write_json
from pipeline.measure.describe import DESCRIPTION_FORMAT, ModelDescription
from pipeline.measure.kinds import ARCHS


class PretrainedError(ValueError):
    """model.pretrained cannot be used; the message is one paragraph naming the key."""


@dataclass(frozen=True)
class PretrainedInfo:
    """What config.json says, in this project's terms."""

    folder: Path  # the folder holding config.json (a snapshot of the cache for a hub name)
    family: str  # transformers' model_type
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int
    max_positions: int | None
    tie_embeddings: bool
    has_weights: bool  # *.safetensors next to config.json


def _folder_of(pretrained: str) -> Path:
    path = Path(pretrained).expanduser()
    if path.exists() or pretrained.startswith((".", "/", "~")) or pretrained.count("/") != 1:
        if not path.is_dir():
            raise PretrainedError(
                f"Invalid value for 'model.pretrained': {pretrained!r} is not a folder. Allowed: a local folder "
                "holding config.json (from save_pretrained), or a Hugging Face hub name (org/name) already in the "
                "local cache."
            )
        if not (path / "config.json").is_file():
            raise PretrainedError(
                f"Invalid value for 'model.pretrained': the folder {pretrained!r} has no config.json. Allowed: "
                "a folder written by save_pretrained (config.json, optionally *.safetensors weights)."
            )
        return path.resolve()
    from huggingface_hub import try_to_load_from_cache  # torch-free; only for hub names

    found = try_to_load_from_cache(pretrained, "config.json")
    if not isinstance(found, str):
        raise PretrainedError(
            f"Invalid value for 'model.pretrained': the hub model {pretrained!r} is not in the local Hugging Face "
            "cache, and nothing is downloaded at run time. Allowed: a local folder with config.json, or a hub name "
            "fetched beforehand (huggingface-cli download " + pretrained + ")."
        )
    return Path(found).parent


def _first(conf: dict[str, Any], *names: str) -> Any:
    for name in names:
        if conf.get(name) is not None:
            return conf[name]
    return None


def read_pretrained(pretrained: str) -> PretrainedInfo:
    folder = _folder_of(pretrained)
    try:
        conf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise PretrainedError(
            f"Invalid value for 'model.pretrained': {folder / 'config.json'} cannot be read as JSON ({e}). "
            "Allowed: a config.json written by save_pretrained."
        ) from e
    if not isinstance(conf, dict):
        raise PretrainedError(
            f"Invalid value for 'model.pretrained': {folder / 'config.json'} holds a JSON "
            f"{type(conf).__name__}, not an object of model settings. Allowed: a config.json written by "
            "save_pretrained (a JSON object with model_type, hidden_size, ...)."
        )
    family = str(conf.get("model_type", ""))
    archs = conf.get("architectures") or []
    causal = any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs) if archs else True
    if not causal or not family:
        raise PretrainedError(
            f"Invalid value for 'model.pretrained': {pretrained!r} is not a causal language model "
            f"(model_type {family!r}, architectures {archs}). Allowed: a decoder-only model that "
            "transformers' AutoModelForCausalLM builds (architectures ending in ForCausalLM or LMHeadModel)."
        )
    n_heads = _first(conf, "num_attention_heads", "n_head")
    hidden = _first(conf, "hidden_size", "n_embd")
    shape = {
        "n_layers": _first(conf, "num_hidden_layers", "n_layer"),
        "hidden": hidden,
        "n_heads": n_heads,
        "n_kv_heads": _first(conf, "num_key_value_heads") or n_heads,
        "ffn_hidden": _first(conf, "intermediate_size", "n_inner") or (4 * hidden if hidden else None),
        "vocab_size": _first(conf, "vocab_size"),
    }
    missing = [k for k, v in shape.items() if not isinstance(v, int)]
    if missing:
        raise PretrainedError(
            f"Invalid value for 'model.pretrained': {folder / 'config.json'} does not give {', '.join(missing)} "
            "as integers. Allowed: a config.json of a decoder-only transformer (hidden_size, num_hidden_layers, "
            "num_attention_heads, vocab_size, ...)."
        )
    tie = conf.get("tie_word_embeddings")
    return PretrainedInfo(
        folder=folder,
        family=family,
        max_positions=_first(conf, "max_position_embeddings", "n_positions"),
        tie_embeddings=bool(tie),  # None: the family's default, which the description reads
        has_weights=any(folder.glob("*.safetensors")),
        **shape,
    )


# The description of the model (pipeline/train/describe.py), made in a helper process so that
# `qualify` never imports torch, and cached: in this process, and on disk by the sha256 of what
# it is made from (config.json's bytes or the preset's fields, the LoRA targets, the versions of
# transformers and of the description), so each distinct model is built once per machine.
_DESCRIBED: dict[str, Any] = {}
ANALYTIC = ARCHS
"""Presets built as these model types keep the analytic shape (pipeline/measure/flops.py, exact
for them and checked against the built model); every other model is described."""


def described(model: Any) -> bool:
    """Whether the numbers of this ModelConfig come from its description: a model.pretrained
    folder of any family, or a preset whose model type is not one of the analytic shapes."""
    return bool(model.pretrained) or model.model_type not in ANALYTIC


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slurm-qualify" / "models"


def _request(model: Any, targets: Sequence[str] | None) -> tuple[dict[str, Any], str]:
    fields = dataclasses.asdict(model)
    made_from: dict[str, Any] = dict(fields)
    if model.pretrained:
        config = read_pretrained(model.pretrained).folder / "config.json"
        made_from = {
            "config.json": hashlib.sha256(config.read_bytes()).hexdigest(),
            "folder": str(config.parent),
        }
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    key = {
        "model": made_from,
        "targets": sorted(targets or []),
        "transformers": version,
        "v": DESCRIPTION_FORMAT,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return {"model": fields, "targets": list(targets) if targets else None}, digest


Describer = Callable[[dict[str, Any]], dict[str, Any]]
_IN_PROCESS: list[Describer] = []


def describe_in_process(describer: Describer) -> None:
    """pipeline.train.describe registers itself here when it is imported: a process that has
    loaded torch and transformers anyway (a job's rank, a notebook, the test suite) describes a
    model itself instead of paying a helper's imports again. The login node's `qualify` never
    imports pipeline.train, so it keeps the helper process and stays free of torch."""
    _IN_PROCESS[:] = [describer]


def describe(model: Any, targets: Sequence[str] | None = None) -> ModelDescription:
    """The description of the model a ModelConfig builds, with the adapters' gradient probe of
    `targets` (None or empty: every linear layer but the output head). A model transformers
    cannot build is one PretrainedError paragraph with its reason."""
    request, digest = _request(model, targets)
    if digest in _DESCRIBED:
        return _DESCRIBED[digest]  # type: ignore[no-any-return]
    cached = _cache_dir() / f"{digest}.json"
    try:
        data = json.loads(cached.read_text())
    except (OSError, ValueError):
        data = _run_here(model, request) if _IN_PROCESS else _run_helper(model, request)
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_json(cached, data, indent=None)
    _DESCRIBED[digest] = ModelDescription.from_json(data)
    return _DESCRIBED[digest]  # type: ignore[no-any-return]


DESCRIBE_TIMEOUT_S = 600
"""The helper that describes a model on the meta device takes seconds (a cold import of torch
and transformers included); a config that keeps it busy past this is refused, not waited for."""


def _not_causal_lm(model: Any, why: str) -> PretrainedError:
    """The paragraph of a description that failed: the step that failed and the library's own
    error (pipeline/train/describe.py names the step: transformers' build, peft's adapters, a
    forward on the meta device), never a guess at the cause."""
    key = "model.pretrained" if model.pretrained else "model"
    why = why.removeprefix("pipeline.train.describe.").removeprefix("DescribeError: ")
    return PretrainedError(
        f"Invalid value for '{key}': {model.pretrained or model.name!r} cannot be described on the meta device: "
        f"{why[:500] or 'no message'}. Allowed: a decoder-only causal language model that transformers' "
        "AutoModelForCausalLM builds from its config (and, for LoRA, whose targets peft adapts)."
    )


def _run_here(model: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The registered describer, in this process; its failure is the helper's paragraph."""
    try:
        return _IN_PROCESS[0](request)
    except Exception as e:  # noqa: BLE001 (any failure to build the model is the user's input)
        first = f"{type(e).__name__}: {e}".splitlines()
        raise _not_causal_lm(model, first[0] if first else "") from e


def _run_helper(model: Any, request: dict[str, Any]) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.train.describe"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            check=False,
            timeout=DESCRIBE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise PretrainedError(
            f"Invalid value for 'model.pretrained': describing {model.pretrained or model.name!r} on the meta "
            f"device took over {DESCRIBE_TIMEOUT_S} s, so its shape cannot be checked here. Allowed: a causal "
            "language model whose config transformers builds in seconds."
        ) from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise _not_causal_lm(model, lines[-1] if lines else "")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]
