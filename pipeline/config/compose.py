"""Compose sweep points with Hydra's compose API and turn them into typed configs.

Composition is where bad input is caught: Hydra refuses unknown group options and misspelt
keys (the schemas are registered), and the dataclasses' `__post_init__` refuses bad values.
Every such failure becomes one `ConfigError` paragraph that names the point and the key.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.config.resolved import candidate_name, drill_label
from pipeline.config.schema import Config, ConfigError, SweepConfig
from pipeline.home import conf_dir


@dataclass
class Point:
    """One sweep point: the overrides that define it and its resolved, validated config."""

    index: int
    overrides: list[str]
    cfg: Config
    yaml: str  # the resolved config, as written next to the run and logged

    @property
    def point_id(self) -> str:
        c = self.cfg
        return f"p{self.index:04d}-{candidate_name(c).replace('/', '-')}-{drill_label(c)}"


def register_configs() -> None:
    """Register the schema: conf/config.yaml puts it first in its defaults, so every group's
    YAML is merged into typed nodes and a misspelt key or a bad type fails at composition."""
    ConfigStore.instance().store(name="config_schema", node=Config)


@contextmanager
def hydra_context(config_dir: Path | None = None) -> Iterator[None]:
    """Initialise Hydra's compose API once; reuse it if a caller already did."""
    register_configs()
    if GlobalHydra.instance().is_initialized():
        yield
        return
    with initialize_config_dir(config_dir=str(config_dir or conf_dir()), version_base="1.3"):
        yield


def _clean(msg: str) -> str:
    msg = re.sub(r"\s*full_key:.*", "", msg)
    msg = re.sub(r"\s*object_type=.*", "", msg)
    msg = re.sub(r"\n\s*\n", "\n", msg).strip()
    return " ".join(line.strip() for line in msg.splitlines() if line.strip())


GROUPS = ("model", "precision", "parallelism", "partition", "drill", "cost", "health", "sweep")


def _explain(e: BaseException) -> str:
    """One readable sentence from a Hydra/OmegaConf error, naming the allowed keys or options."""
    msg = str(e)
    if e.__cause__ is not None and "Error merging override" in msg:
        msg = f"{msg}: {e.__cause__}"
    m = re.search(r"Could not (?:override|append to config)[^']*'([\w.]+)'", msg)
    if m:
        msg = _unknown_key(m.group(1))
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
    return f"Key '{dotted}' cannot be set that way."


def _field_class(annotation: Any) -> Any:
    # dataclass fields annotated as strings (from __future__ annotations): resolve our own classes
    if isinstance(annotation, str):
        from pipeline.config import schema as config_module

        return getattr(config_module, annotation, None)
    return annotation


class Composer:
    """Composes points fast: Hydra composes each distinct set of group choices once, and the
    plain value overrides of each point are applied on a copy with Hydra's own override parser
    (the same code path Hydra uses), so the semantics and the checks stay Hydra's."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, ...], DictConfig] = {}
        self._parser = OverridesParser.create()

    def compose(self, overrides: Sequence[str]) -> DictConfig:
        groups = tuple(o for o in overrides if _key(o) in GROUPS and not o.startswith(("+", "~")))
        values = [o for o in overrides if o not in groups]
        try:
            base = self._cache.get(groups)
            if base is None:
                base = self._cache[groups] = compose(config_name="config", overrides=list(groups))
            cfg = copy.deepcopy(base)
            ConfigLoaderImpl._apply_overrides_to_config(self._parser.parse_overrides(values), cfg)
            return cfg
        except (HydraException, OmegaConfBaseException, ValueError) as e:
            raise ConfigError(
                f"Bad config for overrides {list(overrides)}: {_explain(e)} "
                "(`qualify list` shows the options of every group). Nothing was submitted."
            ) from e


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
    dcfg = (composer or Composer()).compose(overrides)
    cfg = to_typed(dcfg, overrides)
    return Point(index=index, overrides=list(overrides), cfg=cfg, yaml=to_yaml(dcfg))


def to_yaml(dcfg: DictConfig) -> str:
    """The resolved config as YAML, with libyaml's emitter when there is one (5x OmegaConf's)."""
    import yaml

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return str(yaml.dump(OmegaConf.to_container(dcfg, resolve=True), Dumper=dumper, sort_keys=False))


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def expand_grid(sweep: SweepConfig, user_overrides: Sequence[str] = ()) -> list[list[str]]:
    """The override lists of every point: product of the grid axes, then the extra points.

    A user override whose key is a grid axis replaces that axis (`precision=fp32,bf16` sets
    it to two values); a comma-separated value of any other key adds an axis
    (`train.seed=1,2,3`); other user overrides apply to every point, after the preset's own.
    """
    axes: dict[str, list[str]] = {k: [str(v) for v in vals] for k, vals in sweep.grid.items()}
    rest: list[str] = []
    for ov in user_overrides:
        key = _key(ov)
        value = ov.split("=", 1)[1] if "=" in ov else ""
        is_list = value.startswith("[") or value.startswith("{")
        if key in axes and "=" in ov:
            axes[key] = [v for v in value.split(",") if v]
        elif "," in value and not is_list and not ov.startswith(("+", "~")):
            axes[key] = [v for v in value.split(",") if v]  # a new axis, as in Hydra's multirun
        else:
            rest.append(ov)
    common = [*sweep.overrides, *rest]
    points: list[list[str]] = []
    keys = list(axes)
    for combo in itertools.product(*(axes[k] for k in keys)):
        points.append([f"{k}={v}" for k, v in zip(keys, combo, strict=True)] + common)
    narrowing = [ov for ov in user_overrides if _key(ov) in axes and "=" in ov]
    for extra in sweep.extra:
        # a user override of a grid axis narrows the extra points too (precision=fp32 drops fp16)
        if all(_extra_matches(extra, ov) for ov in narrowing):
            points.append([*extra, *common])
    return points


def _extra_matches(extra: Sequence[str], user_override: str) -> bool:
    key, values = user_override.split("=", 1)
    for ov in extra:
        if _key(ov) == _key(key):
            return ov.split("=", 1)[1] in values.split(",")
    return True


def load_sweep(name: str) -> SweepConfig:
    """The sweep preset `name`, composed (and validated) like any group."""
    dcfg = compose_dict([f"sweep={name}"])
    sweep = to_typed(dcfg, [f"sweep={name}"]).sweep
    if not sweep.grid and not sweep.extra:
        raise ConfigError(f"Sweep preset '{name}' has no grid and no extra points: nothing to run.")
    return sweep


def compose_sweep(name: str, user_overrides: Sequence[str] = ()) -> list[Point]:
    """Every point of a sweep, composed and validated; raises ConfigError on the first bad one."""
    with hydra_context():
        sweep = load_sweep(name)
        composer = Composer()
        return [compose_point(i, ovs, composer) for i, ovs in enumerate(expand_grid(sweep, user_overrides))]


def as_dict(cfg: Config) -> dict[str, Any]:
    out = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]
