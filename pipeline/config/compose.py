"""Compose sweep points with Hydra's compose API and turn them into typed configs.

Composition is where bad input is caught: Hydra refuses unknown group options and misspelt
keys (the schemas are registered), and the dataclasses' `__post_init__` refuses bad values.
Every such failure becomes one `ConfigError` paragraph that names the point and the key.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import itertools
import re
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from pipeline.config.repeats import repeat_axis
from pipeline.config.resolved import candidate_name, drill_label
from pipeline.config.schema import Config, ConfigError, LauncherConfig, SweepConfig
from pipeline.config.validate import MemoryFit, check_runs_dir, describe, target_problem
from pipeline.home import conf_dir


@dataclass
class Point:
    """One sweep point: the overrides that define it and its resolved, validated config."""

    index: int
    overrides: list[str]
    cfg: Config
    yaml: str  # the resolved config, as written next to the run and logged
    tree: Any = field(default=None, repr=False, compare=False)  # `yaml` as dicts and lists
    # the memory model's answer, computed once by the planner (submit.sweep.plan) and carried
    memory: MemoryFit | None = field(default=None, repr=False, compare=False)

    @property
    def point_id(self) -> str:
        c = self.cfg
        return f"p{self.index:04d}-{candidate_name(c).replace('/', '-')}-{drill_label(c)}"


def register_configs() -> None:
    """Register the schema: conf/config.yaml puts it first in its defaults, so every group's
    YAML is merged into typed nodes and a misspelt key or a bad type fails at composition."""
    ConfigStore.instance().store(name="config_schema", node=Config)


_ACTIVE_DIR: Path | None = None  # the config folder of the Hydra context we initialised
# Hydra's composition of each set of group choices, kept across sweeps of one process (tests, a
# notebook) while no YAML file of the folder changed: (folder, stamp) -> choices -> config
_BASES: dict[tuple[str, tuple[int, int]], dict[tuple[str, ...], DictConfig]] = {}


@contextmanager
def hydra_context(config_dir: Path | None = None) -> Iterator[None]:
    """Initialise Hydra's compose API once; reuse it if a caller already did."""
    global _ACTIVE_DIR
    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
        return
    folder = Path(config_dir or conf_dir())
    with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
        _ACTIVE_DIR = folder
        try:
            yield
        finally:
            _ACTIVE_DIR = None


def _bases() -> dict[tuple[str, ...], DictConfig]:
    """The composed bases of the active config folder, as long as none of its files changed."""
    if _ACTIVE_DIR is None:  # a caller initialised Hydra on a folder we do not know
        return {}
    files = list(_ACTIVE_DIR.rglob("*.yaml"))
    stamp = (len(files), max((f.stat().st_mtime_ns for f in files), default=0))
    key = (str(_ACTIVE_DIR), stamp)
    if key not in _BASES:
        for old in [k for k in _BASES if k[0] == key[0]]:
            del _BASES[old]
    return _BASES.setdefault(key, {})


def _clean(msg: str) -> str:
    msg = re.sub(r"\s*full_key:.*", "", msg)
    msg = re.sub(r"\s*object_type=.*", "", msg)
    msg = re.sub(r"\s*reference_type=\S*", "", msg)
    msg = re.sub(r"\n\s*\n", "\n", msg).strip()
    return " ".join(line.strip() for line in msg.splitlines() if line.strip())


GROUPS = (
    "model",
    "method",
    "precision",
    "parallelism",
    "partition",
    "drill",
    "data",
    "cost",
    "health",
    "sweep",
)


def _explain(e: BaseException) -> str:
    """One readable sentence from a Hydra/OmegaConf error, naming the allowed keys or options."""
    full_key = getattr(e, "full_key", None)
    if isinstance(e, ConfigKeyError) and full_key:
        return _unknown_key(str(full_key))
    msg = str(e)
    if e.__cause__ is not None and "Error merging override" in msg:
        msg = f"{msg}: {e.__cause__}"
    m = re.search(r"Could not (?:override|append to config)[^']*'([\w.]+)'", msg)
    if m:
        msg = _unknown_key(m.group(1))
    m = re.search(r"Could not load '(\w+)/([^']+)'", msg)
    if m and "Available options" not in msg and (conf_dir() / m.group(1)).is_dir():
        options = sorted(f.stem for f in (conf_dir() / m.group(1)).glob("*.yaml"))
        msg = f"No option '{m.group(2)}' in group '{m.group(1)}'. Available options: {', '.join(options)}."
    msg = re.sub(r"\s*Config search path:.*", "", msg, flags=re.S)
    msg = re.sub(r"\s\w+_schema\b", "", msg)  # the schemas are not options a user picks
    return _clean(msg)


def _unknown_key(dotted: str) -> str:
    """'parallelism.zero_stag' -> which key is unknown, and the keys that exist there."""
    node: Any = Config
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        fields = getattr(node, "__dataclass_fields__", None)
        if fields is None or part not in fields:
            where = ".".join(parts[:i]) or "the top level"
            allowed = sorted(fields) if fields else []
            close = difflib.get_close_matches(part, allowed, n=1)
            hint = f" Did you mean '{'.'.join([*parts[:i], close[0]])}'?" if close else ""
            return f"Unknown key '{dotted}': '{part}' is not a key of {where}. Keys there: {', '.join(allowed)}.{hint}"
        node = fields[part].type
        node = _field_class(node)
    return (
        f"Key '{dotted}' exists: set it with {dotted}=<value> ('+' adds a key, and the schema has "
        "every key; a group's option is chosen with <group>=<option>)."
    )


def _field_class(annotation: Any) -> Any:
    # dataclass fields annotated as strings (from __future__ annotations): resolve our own classes
    if isinstance(annotation, str):
        from pipeline.config import schema as config_module

        return getattr(config_module, annotation, None)
    return annotation


class Composer:
    """Composes points fast: Hydra composes each distinct set of group choices once, and the
    plain value overrides of each point are applied on a copy with Hydra's own override parser
    (the same code path Hydra uses), so the semantics and the checks stay Hydra's.

    `point` goes further for the common case, a point whose value overrides all set one
    scalar or list (a seed, a learning rate, a micro-batch): each value is checked by
    assigning it, with Hydra's code, to one scratch copy of the base that is kept per set of
    group choices, and the point is that base's resolved tree with the checked values put in,
    built into the dataclasses (their validation runs as always). Any other override, and any
    point that fails there, takes the full path, whose result or error is the reference; a
    test holds the two paths equal."""

    def __init__(self) -> None:
        self._cache = _bases()  # never mutated: each point composes on a deep copy
        self._parser = OverridesParser.create()
        self._scratch: dict[tuple[str, ...], DictConfig] = {}  # values are tried on these
        self._plain: dict[tuple[str, ...], dict[str, Any]] = {}  # each base, resolved

    def _base(self, groups: tuple[str, ...]) -> DictConfig:
        base = self._cache.get(groups)
        if base is None:
            base = self._cache[groups] = compose(config_name="config", overrides=list(groups))
        return base

    def point(self, index: int, overrides: Sequence[str]) -> Point:
        """One point, composed, validated and rendered; the fast path when it applies."""
        parsed = [parse_override(o) for o in overrides]
        groups = tuple(text for text, o in zip(overrides, parsed, strict=True) if o.key_or_group in GROUPS)
        values = [o for o in parsed if o.key_or_group not in GROUPS]
        if all(_plain_value(o) for o in values):
            try:
                return self._fast_point(index, overrides, groups, values)
            except Exception:  # noqa: BLE001 (the full path below gives the reference error)
                self._scratch.pop(groups, None)
        dcfg = self.compose(overrides)
        cfg = to_typed(dcfg, overrides)
        tree = OmegaConf.to_container(dcfg, resolve=True)
        as_built(cfg, tree, overrides)
        return Point(index=index, overrides=list(overrides), cfg=cfg, yaml=_dump_yaml(tree), tree=tree)

    def _fast_point(
        self, index: int, overrides: Sequence[str], groups: tuple[str, ...], values: list[Override]
    ) -> Point:
        with _hydra_errors(overrides):
            base = self._base(groups)
        if groups not in self._plain:
            self._plain[groups] = OmegaConf.to_container(base, resolve=True)  # type: ignore[assignment]
        if groups not in self._scratch:
            self._scratch[groups] = copy.deepcopy(base)
        scratch = self._scratch[groups]
        tree = _copy_tree(self._plain[groups])
        for o in values:
            apply_overrides(scratch, [o])
            value = OmegaConf.select(scratch, o.key_or_group)
            if isinstance(value, DictConfig | ListConfig):
                value = OmegaConf.to_container(value, resolve=True)
            *path, leaf = o.key_or_group.split(".")
            node = tree
            for part in path:
                node = node[part]
            node[leaf] = value
        try:
            cfg = _build(Config, tree)
        except ConfigError as e:
            raise ConfigError(
                f"Bad config for overrides {list(overrides)}: {e} Nothing was submitted."
            ) from e
        as_built(cfg, tree, overrides)
        return Point(index=index, overrides=list(overrides), cfg=cfg, yaml=_dump_yaml(tree), tree=tree)

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        """One point. Every override is parsed by Hydra's grammar; group choices (`drill=...`,
        `drill=[a,b]`, `~drill`) go to Hydra's defaults list, values to the composed copy, and a
        `+`/`++` override is checked against the schema like any other (it may not add a key)."""
        parsed = [parse_override(o) for o in overrides]
        groups = tuple(text for text, o in zip(overrides, parsed, strict=True) if o.key_or_group in GROUPS)
        values = [o for o in parsed if o.key_or_group not in GROUPS]
        for o in values:
            if o.type == OverrideType.DEL:
                raise ConfigError(
                    f"Bad override '~{o.key_or_group}': '~' deletes a key, and every key of the config has its "
                    f"value in the schema; set '{o.key_or_group}' to a value instead, or drop a group's option "
                    f"with ~<group> ({', '.join(GROUPS)}). `qualify list --keys` shows every key and its "
                    "default. Nothing was submitted."
                )
        with _hydra_errors(overrides):
            cfg = copy.deepcopy(self._base(groups))
            apply_overrides(cfg, values)
            if any(o.type in (OverrideType.ADD, OverrideType.FORCE_ADD) for o in values):
                # a key the schema lacks fails here (a plain container: the node keeps no open struct flag)
                OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.to_container(cfg))
        return cfg


# the model keys a model.pretrained folder's config.json decides
FROM_CONFIG_JSON = (
    "family",
    "n_layers",
    "hidden",
    "n_heads",
    "n_kv_heads",
    "ffn_hidden",
    "vocab_size",
    "tie_embeddings",
)


def as_built(cfg: Config, tree: Any, overrides: Sequence[str]) -> None:
    """LoRA targets the model lacks are refused (one paragraph). With model.pretrained, the model section becomes the model as built (config.json's shape,
    the tie of its output layer as transformers builds it) in the typed config and in the tree
    that config.yaml is written from. A key config.json decides that the user also set is a
    check: equal, or refused (one paragraph). The ranks per node the partition filled in are
    written into the tree too."""
    tree["parallelism"]["gpus_per_node"] = cfg.parallelism.gpus_per_node
    m = cfg.model
    lacking = target_problem(cfg)
    if lacking:
        raise ConfigError(f"Bad config for overrides {list(overrides)}: {lacking}. Nothing was submitted.")
    if not m.pretrained:
        return
    d = describe(m)
    m.tie_embeddings, m.vocab_size, m.hidden, m.n_layers = (
        d.tie_embeddings,
        d.vocab_size,
        d.hidden,
        d.n_layers,
    )
    keys = {o: parse_override(o).key_or_group for o in overrides}
    given = {k.removeprefix("model."): o for o, k in keys.items() if k.startswith("model.")}
    for key in FROM_CONFIG_JSON:
        if key in given and tree["model"][key] != getattr(m, key):
            raise ConfigError(
                f"Bad config for overrides {list(overrides)}: '{given[key]}' contradicts model.pretrained="
                f"{m.pretrained}, whose config.json builds {key}={getattr(m, key)!r}; the model is built from "
                f"config.json, so drop model.{key} (or set it to {getattr(m, key)!r} as a check), or save a "
                "folder with the shape you want. Nothing was submitted."
            )
    tree["model"] = dataclasses.asdict(m)


def apply_overrides(cfg: DictConfig, overrides: Sequence[Override]) -> None:
    """Apply parsed value overrides (key=value, +key, ++key, ~key) to a composed config in place,
    as Hydra applies them while composing. The one call into a private Hydra API
    (`ConfigLoaderImpl._apply_overrides_to_config`, Hydra 1.3): it lets a sweep compose each set
    of group choices once and put each point's values on a copy, 1.2 s for 300 points where
    Hydra's public `compose` per point takes 67 s. tests/unit/test_config.py holds it to the public
    `compose` (and to its signature), so a Hydra release that changes it fails there."""
    ConfigLoaderImpl._apply_overrides_to_config(list(overrides), cfg)


@contextmanager
def _hydra_errors(overrides: Sequence[str]) -> Iterator[None]:
    """A Hydra or OmegaConf error while composing becomes one ConfigError naming the point."""
    try:
        yield
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(
            f"Bad config for overrides {list(overrides)}: {_explain(e)} "
            "(`qualify list` shows the options of every group, `qualify list --keys` every key). "
            "Nothing was submitted."
        ) from e


def _plain_value(o: Override) -> bool:
    """An override the fast path takes: key=value setting a scalar or a list of scalars (no
    dict, which merges into what is there; no interpolation, which resolves against the rest)."""
    if o.type != OverrideType.CHANGE or o.is_sweep_override() or o.package is not None:
        return False
    value = o.value()
    items = value if isinstance(value, list) else [value]
    return all(
        v is None or (isinstance(v, bool | int | float | str) and not (isinstance(v, str) and "${" in v))
        for v in items
    )


def _copy_tree(node: Any) -> Any:
    """A copy of a tree of dicts, lists and scalars (a few times faster than copy.deepcopy)."""
    if isinstance(node, dict):
        return {k: _copy_tree(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy_tree(v) for v in node]
    return node


_HINTS: dict[type, dict[str, Any]] = {}


def _build(cls: type, tree: dict[str, Any]) -> Any:
    """The dataclass `cls` from a resolved tree whose values the schema already checked (as
    OmegaConf.to_object builds it: nested dataclasses built first, each __post_init__ run)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in tree:
            continue
        value, inner = tree[f.name], _dataclass_in(hints[f.name])
        kwargs[f.name] = (
            _build(inner, value) if inner is not None and value is not None else _copy_tree(value)
        )
    return cls(**kwargs)


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field holds (itself, or inside Optional), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg) and isinstance(arg, type):
            return arg
    return None


def compose_dict(overrides: Sequence[str]) -> DictConfig:
    """Compose conf/config.yaml with the overrides; raise ConfigError on any bad input."""
    return Composer().compose(overrides)


def to_typed(dcfg: DictConfig, overrides: Sequence[str] = ()) -> Config:
    """Turn a composed DictConfig into the dataclasses, running their validation."""
    try:
        cfg = OmegaConf.to_object(dcfg)
    except ConfigError as e:
        raise ConfigError(f"Bad config for overrides {list(overrides)}: {e} Nothing was submitted.") from e
    except (OmegaConfBaseException, ValueError) as e:
        cause = e.__cause__ if isinstance(e.__cause__, ConfigError) else e
        raise ConfigError(
            f"Bad config for overrides {list(overrides)}: {_explain(cause)} Nothing was submitted."
        ) from e
    assert isinstance(cfg, Config)
    return cfg


def compose_point(index: int, overrides: Sequence[str], composer: Composer | None = None) -> Point:
    return (composer or Composer()).point(index, overrides)


def to_yaml(dcfg: DictConfig) -> str:
    """The resolved config as YAML."""
    return _dump_yaml(OmegaConf.to_container(dcfg, resolve=True))


def _dump_yaml(tree: Any) -> str:
    """A plain tree as YAML, with libyaml's emitter when there is one (5x OmegaConf's)."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(tree, Dumper=dumper, sort_keys=False))


_PARSER: OverridesParser | None = None


@functools.lru_cache(maxsize=65536)  # Hydra reads an Override and never changes it
def parse_override(text: str) -> Override:
    """One override parsed by Hydra's own grammar; a lexer error becomes one clear ConfigError."""
    global _PARSER
    _refuse_undecodable(text)
    if _PARSER is None:
        _PARSER = OverridesParser.create()
    try:
        return _PARSER.parse_override(text)
    except HydraException as e:
        raise ConfigError(
            f"Bad override {text!r}: it is not Hydra override syntax ({_explain(e)}). Write key=value; "
            "quote a value that holds spaces, unicode or other special characters (key='a value'); "
            "a comma list (key=a,b) makes one point per value and [a,b] is one list value. "
            "Nothing was submitted."
        ) from e


def _refuse_undecodable(text: str) -> None:
    """A byte that is not UTF-8 (Python keeps one from the command line as a lone surrogate,
    U+DC80..U+DCFF): refused with the key and the byte, quoted or not. Inside quotes Hydra took
    it, and every later write of the value failed (UnicodeEncodeError)."""
    at = next((i for i, c in enumerate(text) if "\udc80" <= c <= "\udcff"), None)
    if at is None:
        return
    key = text.split("=", 1)[0].lstrip("+~")
    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    raise ConfigError(
        f"Bad override '{shown}': the value of {key} holds the byte 0x{ord(text[at]) - 0xDC00:02x} (character "
        f"{at + 1}), which is not UTF-8: the shell passed raw bytes (a terminal or file in another encoding, "
        "or LANG=C with a non-ASCII character). Every value is written as UTF-8 (the config, the manifest, "
        "MLflow): type the value in UTF-8, or leave the character out. Nothing was submitted."
    )


def _values(override: Override) -> list[str]:
    """The value strings of an override: each choice of a sweep (a,b or range(...)), or its one value."""
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def expand_grid(sweep: SweepConfig, user_overrides: Sequence[str] = ()) -> list[list[str]]:
    """The override lists of every point: product of the grid axes, then the extra points.

    Every override is parsed with Hydra's grammar. A user override whose key is a grid axis
    replaces that axis (`precision=fp32,bf16` sets it to two values, `drill=[checkpoint,preempt]`
    to one list value); a sweep of any other key adds an axis (`train.seed=1,2,3`, as in Hydra's
    multirun); other user overrides apply to every point, after the preset's own.
    """
    axes: dict[str, list[str]] = {k: [f"{k}={v}" for v in vals] for k, vals in sweep.grid.items()}
    rest: list[str] = []
    narrowing: list[Override] = []
    for ov in user_overrides:
        o = parse_override(ov)
        key = o.key_or_group
        if o.type != OverrideType.CHANGE:  # +key=value, ++key=value, ~key: one value for every point
            rest.append(ov)
        elif o.is_sweep_override():
            axes[key] = [f"{key}={v}" for v in _values(o)]
            if not axes[key]:
                raise ConfigError(
                    f"Invalid value for '{key}': {ov!r} sweeps over no value, so the sweep has no point. "
                    f"Allowed: a sweep of at least one value (e.g. {key}=range(0,3) or {key}=1,2). "
                    "Nothing was submitted."
                )
            narrowing += [o] if key in sweep.grid else []
        elif key in axes:
            axes[key] = [ov]
            narrowing.append(o)
        else:
            rest.append(ov)
    common = [*sweep.overrides, *rest]
    points = [[*combo, *common] for combo in itertools.product(*axes.values())]
    for extra in sweep.extra:
        # a user override of a grid axis narrows the extra points too (precision=fp32 drops fp16)
        if all(_extra_matches(extra, o) for o in narrowing):
            points.append([*extra, *common])
    seeds = repeat_axis(sweep, user_overrides)  # sweep.repeats=N: every point N times
    return (
        points
        if seeds is None
        else [
            [*(o for o in p if parse_override(o).key_or_group != "train.seed"), s]
            for p in points
            for s in seeds
        ]
    )


def _extra_matches(extra: Sequence[str], user: Override) -> bool:
    for ov in extra:
        o = parse_override(ov)
        if o.key_or_group == user.key_or_group:
            return set(_values(o)) <= set(_values(user))
    return True


def load_sweep(name: str) -> SweepConfig:
    """The sweep preset `name`, composed (and validated) like any group."""
    dcfg = compose_dict([f"sweep={name}"])
    sweep = to_typed(dcfg, [f"sweep={name}"]).sweep
    if not sweep.grid and not sweep.extra:
        raise ConfigError(f"Sweep preset '{name}' has no grid and no extra points: nothing to run.")
    return sweep


def check_point_count(n: int, user_overrides: Sequence[str]) -> None:
    """Refuse a sweep of more points than launcher.max_points (from the overrides, else the
    schema's default) before composing any: 100,000 points took minutes with no output."""
    cap = LauncherConfig().max_points
    for ov in user_overrides:
        key, _, raw = ov.partition("=")
        if key.lstrip("+") == "launcher.max_points":
            with contextlib.suppress(ValueError):
                cap = max(1, int(raw))
    if n > cap:
        raise ConfigError(
            f"Invalid sweep: {n:,} points is over 'launcher.max_points'={cap:,}. Allowed: at most "
            f"launcher.max_points points; narrow the grid (qualify show lists the points), or raise the cap "
            f"on purpose: launcher.max_points={n}. Nothing was submitted."
        )


def compose_sweep(name: str, user_overrides: Sequence[str] = ()) -> list[Point]:
    """Every point of a sweep, composed and validated (and the runs_dir it would write into);
    raises ConfigError on the first bad one."""
    with hydra_context():
        sweep = load_sweep(name)
        composer = Composer()
        grid = expand_grid(sweep, user_overrides)
        check_point_count(len(grid), user_overrides)
        points = [compose_point(i, ovs, composer) for i, ovs in enumerate(grid)]
    for runs_dir in sorted({p.cfg.runs_dir for p in points}):
        check_runs_dir(runs_dir)
    return points


def as_dict(cfg: Config) -> dict[str, Any]:
    out = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]
